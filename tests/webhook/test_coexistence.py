"""The webhook's start-up warning when a device plugin or an extended-resource class serves nvidia.com/gpu."""

from __future__ import annotations

from typing import Any

from dra_driver.kube.api import DEVICE_CLASSES, NODES, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.webhook.coexistence import coexistence_warnings


class FakeKube:
    def __init__(
        self, nodes: list[dict[str, Any]], classes: list[dict[str, Any]], error: bool = False
    ) -> None:
        self.items = {NODES.plural: nodes, DEVICE_CLASSES.plural: classes}
        self.error = error

    def list(self, resource: Resource, **_: Any) -> dict[str, Any]:
        if self.error:
            raise KubeError(403, "nodes is forbidden")
        return {"items": self.items[resource.plural]}


def node(name: str, allocatable: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": allocatable}}


def test_nothing_else_serving_gpus_means_no_warning() -> None:
    kube = FakeKube([node("n1", {"cpu": "4"})], [{"metadata": {"name": "gpu.hami.io"}, "spec": {}}])
    assert coexistence_warnings(kube) == []  # type: ignore[arg-type]


def test_device_plugins_and_mapped_classes_are_named_with_who_wins() -> None:
    kube = FakeKube(
        [node("n1", {"nvidia.com/gpu": "8"}), node("n2", {"cpu": "4"})],
        [{"metadata": {"name": "nvidia-gpus"}, "spec": {"extendedResourceName": "nvidia.com/gpu"}}],
    )
    plugin, mapped = coexistence_warnings(kube)  # type: ignore[arg-type]
    assert "advertises nvidia.com/gpu on 1 node(s) (n1)" in plugin
    assert "DeviceClass nvidia-gpus maps the extended resource nvidia.com/gpu" in mapped
    assert "gpu.hami.io/hami-resources=enabled hami-dra translates the pods and wins" in mapped


def test_a_forbidden_check_says_so_instead_of_failing() -> None:
    (warning,) = coexistence_warnings(FakeKube([], [], error=True))  # type: ignore[arg-type]
    assert "could not check what else serves nvidia.com/gpu" in warning and "403" in warning
