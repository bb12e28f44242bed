"""The real kube-apiserver's answers to the patches the binder sends a pod (dra_driver/resource/edits.py):
what the in-memory fakes (tests/controller/fake_kube.py, dra_driver/sandbox) must answer alike.

The gate is lifted with a JSON patch whose ``test`` ops make it fail instead of overwriting: a
failed ``test`` is 422 and writes nothing, a ``test`` of ``null`` passes on a missing member (the
pod has no annotations yet), and the gate is removed by index. The condition is a strategic merge
patch of ``pods/status`` (conditions merge by type) carrying the pod's uid, which a pod of the same
name that is another object refuses (422: the uid is immutable; an Update's uid precondition would
be 409).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.contract import ALLOCATED_CONDITION
from dra_driver.kube.api import PODS, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.resource.edits import condition_patch, gate_patch
from dra_driver.resource.objects import PodView

pytestmark = pytest.mark.cluster

NAMESPACE = "default"
OTHER_GATE = "example.com/other"
#: Our gate's stand-in: the driver may run in this cluster session, and its admission policy lets
#: only its controller remove its own gate (which it also lifts from pods that are not its own).
GATE = "example.com/ours"


@pytest.fixture
def kube(real_cluster: Any) -> Kube:
    return Kube(real_cluster.api_client)


@pytest.fixture
def gated_pod(kube: Kube) -> Iterator[dict[str, Any]]:
    """A pod held by another component's gate and ours, without annotations."""
    name = f"patch-{uuid.uuid4().hex[:8]}"
    pod = kube.create(
        PODS,
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "schedulingGates": [{"name": OTHER_GATE}, {"name": GATE}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    yield pod
    with contextlib.suppress(KubeError):
        kube.request("DELETE", PODS.path(NAMESPACE, name), body={"gracePeriodSeconds": 0})


def gates(pod: Any) -> list[str]:
    return [gate["name"] for gate in pod["spec"].get("schedulingGates") or ()]


def _patch(kube: Kube, pod: dict[str, Any], ops: Any, *, status: bool = False) -> dict[str, Any]:
    return kube.patch(PODS, NAMESPACE, pod["metadata"]["name"], ops, status=status)


def test_gate_patch_lifts_our_gate_and_adds_annotations_to_a_pod_without_any(
    kube: Kube, gated_pod: dict[str, Any]
) -> None:
    ops = gate_patch(PodView.parse(gated_pod), {"gpu.hami.io/decision": "d", "example.com/x": "x"}, GATE)
    assert ops is not None
    written = _patch(kube, gated_pod, ops)
    assert gates(written) == [OTHER_GATE]
    assert written["metadata"]["annotations"] == {"gpu.hami.io/decision": "d", "example.com/x": "x"}


def test_gate_patch_keeps_annotations_written_since(kube: Kube, gated_pod: dict[str, Any]) -> None:
    ops = gate_patch(PodView.parse(gated_pod), {"gpu.hami.io/decision": "d"}, GATE)
    _patch(kube, gated_pod, {"metadata": {"annotations": {"someone/else": "1"}}})
    with pytest.raises(KubeError) as failed:  # our copy had no annotations: the test of null fails
        _patch(kube, gated_pod, ops)
    assert failed.value.status == 422, failed.value
    current = PodView.parse(kube.get(PODS, NAMESPACE, gated_pod["metadata"]["name"]))
    assert gates(current) == [OTHER_GATE, GATE] and current.annotations == {"someone/else": "1"}
    again = gate_patch(current, {"gpu.hami.io/decision": "d"}, GATE)
    assert again is not None
    written = _patch(kube, gated_pod, again)
    assert written["metadata"]["annotations"] == {"someone/else": "1", "gpu.hami.io/decision": "d"}
    assert gates(written) == [OTHER_GATE]


def test_gate_patch_of_another_object_or_a_moved_gate_fails_and_writes_nothing(
    kube: Kube, gated_pod: dict[str, Any]
) -> None:
    view = PodView.parse(gated_pod)
    stale_uid = {**gated_pod, "metadata": {**gated_pod["metadata"], "uid": str(uuid.uuid4())}}
    for stale in (
        stale_uid,
        {**gated_pod, "spec": {**gated_pod["spec"], "schedulingGates": [{"name": GATE}]}},
    ):
        ops = gate_patch(PodView.parse(stale), {"gpu.hami.io/decision": "d"}, GATE)
        assert ops is not None
        with pytest.raises(KubeError) as failed:
            _patch(kube, gated_pod, ops)
        assert failed.value.status == 422, failed.value
    current = PodView.parse(kube.get(PODS, NAMESPACE, view.name))
    assert gates(current) == [OTHER_GATE, GATE] and current.resource_version == view.resource_version


def test_a_gate_can_only_be_removed(kube: Kube, gated_pod: dict[str, Any]) -> None:
    with pytest.raises(KubeError) as failed:
        _patch(kube, gated_pod, [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x/y"}}])
    assert failed.value.status == 422, failed.value


def test_condition_patch_merges_by_type_and_checks_the_uid(kube: Kube, gated_pod: dict[str, Any]) -> None:
    view = PodView.parse(gated_pod)
    written = _patch(
        kube,
        gated_pod,
        condition_patch(view, "False", "Unschedulable", "no", "2026-12-06T00:00:00Z"),
        status=True,
    )
    assert PodView.parse(written).allocated_condition == "False"
    others = [c["type"] for c in written["status"]["conditions"] if c["type"] != ALLOCATED_CONDITION]
    written = _patch(
        kube, gated_pod, condition_patch(view, "True", "Allocated", "ok", "2026-12-06T00:00:01Z"), status=True
    )
    assert PodView.parse(written).allocated_condition == "True"
    assert [c["type"] for c in written["status"]["conditions"] if c["type"] != ALLOCATED_CONDITION] == others
    stale = PodView.parse({**gated_pod, "metadata": {**gated_pod["metadata"], "uid": str(uuid.uuid4())}})
    with pytest.raises(KubeError) as failed:
        _patch(
            kube, gated_pod, condition_patch(stale, "False", "X", "y", "2026-12-06T00:00:02Z"), status=True
        )
    assert failed.value.status == 422 and "uid" in str(failed.value), failed.value


def test_a_merge_patch_of_another_object_is_refused(kube: Kube, gated_pod: dict[str, Any]) -> None:
    """The HAMi translation's mark (dra_driver/controller/hami_templates.py) is a merge patch with the uid."""
    with pytest.raises(KubeError) as failed:
        _patch(kube, gated_pod, {"metadata": {"uid": str(uuid.uuid4()), "annotations": {"a.example/b": "c"}}})
    assert failed.value.status == 422 and "uid" in str(failed.value), failed.value
    current = kube.get(PODS, NAMESPACE, gated_pod["metadata"]["name"])
    assert current["metadata"]["resourceVersion"] == gated_pod["metadata"]["resourceVersion"]
