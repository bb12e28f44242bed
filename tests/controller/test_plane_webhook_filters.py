"""Which objects kube-apiserver sends our webhook, with the configurations the development
clusters register (hami_dra_dev/webhooks.py, the chart's match conditions): GpuConfig is still
validated where a claim or template carries config for our driver, and a claim or a pod that our
webhook has nothing to say about costs the API server no round trip (the benchmark measures the
API server's work per pod through these configurations)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dra_driver.kube.errors import KubeError
from dra_driver.webhook.server import WebhookServer
from hami_dra_dev.cluster.controlplane import ControlPlane
from tests.controller.harness import DRIVER, GATE, Harness, claim, device_class, plane_harness, pod
from tests.controller.plane_driver import plane_webhook, short_directory


@pytest.fixture
def plane(controller_plane: ControlPlane) -> Iterator[tuple[Harness, WebhookServer]]:
    with (
        short_directory() as root,
        plane_harness(controller_plane) as h,
        plane_webhook(controller_plane, root) as webhook,
    ):
        yield h, webhook


def reviews(webhook: WebhookServer, path: str) -> float:
    """AdmissionReviews the webhook answered on ``path``, whatever the outcome."""
    total = 0.0
    for family in webhook.metrics.registry.collect():
        if family.name != "hami_dra_webhook_reviews":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("path") == path:
                total += sample.value
    return total


def test_gpuconfig_is_validated_and_nothing_else_is_sent(plane: tuple[Harness, WebhookServer]) -> None:
    h, webhook = plane
    h.create_class(device_class(DRIVER))
    validated, mutated = reviews(webhook, "/validate"), reviews(webhook, "/mutate")

    with pytest.raises(KubeError) as refused:
        h.create_claim(claim("bad-config", config={"policy": "binpak"}))
    assert "invalid GpuConfig" in refused.value.message and "binpak" in refused.value.message
    assert reviews(webhook, "/validate") == validated + 1

    h.create_claim(claim("good-config", config={"policy": "binpack"}))
    assert reviews(webhook, "/validate") == validated + 2, "config for our driver is validated"

    h.create_claim(claim("no-config"))
    h.create_pod(pod("no-claims", {}, gated=False))
    assert reviews(webhook, "/validate") == validated + 2, "a claim without our config is not sent"
    assert reviews(webhook, "/mutate") == mutated, "a pod without claims is not sent"

    gated = h.create_pod(pod("with-claim", {"gpu": "claim:no-config"}, gated=False))
    assert reviews(webhook, "/mutate") == mutated + 1
    assert [g["name"] for g in gated["spec"].get("schedulingGates") or ()] == [GATE], "our webhook gated it"
