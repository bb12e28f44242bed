"""Each recipe of the seed's table end to end: webhook gate -> controller allocation -> scheduler
binding -> real kubelet plugin (child process) prepares the claim through the kubelet simulator."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.kube.api import PODS
from dra_driver.webhook.lookup import KubeLookup
from dra_driver.webhook.server import WebhookServer, tls_context
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.sandbox import SandboxServer
from hami_dra_dev.sandbox.cluster import SandboxCluster
from hami_dra_dev.sandbox.driver import DriverOptions, kubelet_factory, start_kubelet_plugins
from hami_dra_dev.sandbox.webhooks import register_webhooks
from tests.controller.harness import DRIVER, NS, Harness, claim, device_class, pod, request, wait_for

INDEX = 'device.attributes["gpu.hami.io"].index == {}'
# The seed's worked-example state: gpu-0 two 1000Mi tenants (3.30), gpu-1 one (1.65), gpu-2/3 idle.
RECIPES = [
    ("binpack", "gpu-0"),
    ("spread", "gpu-2"),
    ("mutex", "gpu-2"),
    ("binpack,numa", "gpu-0"),
    ("mutex,binpack", "gpu-2"),
    ("mutex,binpack,numa", "gpu-2"),
]


def register_webhook(server: SandboxServer, webhook: WebhookServer, ca_pem: bytes) -> None:
    ca = base64.b64encode(ca_pem).decode()
    register_webhooks(server.api, f"https://127.0.0.1:{webhook.port}", ca, DRIVER)


@pytest.fixture
def e2e(sandbox: SandboxServer) -> Iterator[tuple[Harness, SandboxCluster]]:
    factory = kubelet_factory()
    if factory is None:
        pytest.skip("kubelet simulator unavailable")
    cluster = SandboxCluster(sandbox, nodes=["node-1"], kubelet_factory=factory, resync=0.05).start()
    h = Harness(sandbox, cluster)
    pair = make_self_signed(sandbox.state_dir / "webhook-tls", "hami-dra-webhook")
    webhook = WebhookServer(
        KubeLookup(sandbox.api_client(), DRIVER, class_ttl=0.0),
        DRIVER,
        host="127.0.0.1",
        port=0,
        ssl_context=tls_context(str(pair.cert_file), str(pair.key_file)),
    )
    webhook.start()
    try:
        register_webhook(sandbox, webhook, pair.ca_pem)
        start_kubelet_plugins(cluster, DriverOptions(profile="t4", gpus=4))
        yield h, cluster
    finally:
        h.stop()
        cluster.stop()
        webhook.stop()


@pytest.mark.slow
def test_recipes_end_to_end(e2e: tuple[Harness, SandboxCluster]) -> None:
    h, cluster = e2e
    h.create_class(device_class(DRIVER))
    controller = h.start_controller()
    wait_for(
        lambda: (
            len(controller.cache.ledger.inventory.get("node-1", ()).devices) == 4  # type: ignore[union-attr]
            if "node-1" in controller.cache.ledger.inventory
            else False
        ),
        timeout=30,
        what="slices published",
    )
    for name, index in (("t1", 0), ("t2", 0), ("t3", 1)):
        h.create_claim(claim(name, request(memory="1000Mi", selectors=[INDEX.format(index)])))
        created = h.create_pod(pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False))
        assert created["spec"]["schedulingGates"] == [
            {"name": "gpu.hami.io/allocation"}
        ]  # the webhook gated it
    for name in ("t1", "t2", "t3"):
        wait_for(lambda name=name: h.bound_node(f"{name}-pod"), what=f"{name} bound")
    kubelet: Any = cluster.kubelets["node-1"]
    for number, (recipe, expected) in enumerate(RECIPES):
        name = f"r{number}"
        h.create_claim(claim(name, request(memory="1000Mi")))
        annotations = {"hami.io/gpu-scheduler-policy": recipe}
        created = h.create_pod(
            pod(f"{name}-pod", {"gpu": f"claim:{name}"}, gated=False, annotations=annotations)
        )
        wait_for(lambda name=name: h.bound_node(f"{name}-pod"), what=f"{recipe} bound")
        assert h.devices_of(name) == [f"node-1/{expected}"], recipe
        uid = created["metadata"]["uid"]
        ids = wait_for(lambda uid=uid: kubelet.cdi_ids(uid), timeout=15, what=f"{recipe} prepared")
        assert any(cdi.startswith("k8s.gpu.hami.io/gpu=") for cdi in ids), ids
        h.kube.delete(PODS, NS, f"{name}-pod")
        wait_for(lambda name=name: not h.allocated(name), timeout=15, what=f"{recipe} released")
    assert not kubelet.errors


@pytest.mark.slow
def test_webhook_rejects_invalid_gpuconfig_through_the_api(e2e: tuple[Harness, SandboxCluster]) -> None:
    h, _ = e2e
    from dra_driver.kube.errors import KubeError

    with pytest.raises(KubeError) as err:
        h.create_class(device_class("bad", {"policy": "mutex,packed"}))
    assert err.value.status in (400, 403, 422)
    assert "unknown policy name(s) 'packed'" in err.value.message


@pytest.mark.slow
def test_webhook_rejects_two_limited_claims_in_one_container(e2e: tuple[Harness, SandboxCluster]) -> None:
    h, _ = e2e
    from dra_driver.kube.errors import KubeError

    h.create_class(device_class(DRIVER))
    h.create_claim(claim("lim-a", request(memory="1Gi")))
    h.create_claim(claim("lim-b", request(memory="1Gi")))
    with pytest.raises(KubeError) as err:
        h.create_pod(pod("two-limits", {"a": "claim:lim-a", "b": "claim:lim-b"}, gated=False))
    two = "container main consumes claim a with memory/cores limits together with another GPU (claim b)"
    assert two in err.value.message
