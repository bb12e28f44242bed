"""Node data safety: hostile claim references, and entries of claims deleted from the API.

Malformed claim references from kubelet (or anything that reaches the socket) touch nothing else.
The HAMi-core claim directory is ``<plugin-dir>/hami-core/claims/<uid>`` and is removed
recursively on unprepare, so a UID of ``""`` or ``..`` must be refused before any path is built:
each bad reference gets its own error, every other claim in the same request is served as usual.
A claim deleted from the API keeps its entry, and its share, until kubelet unprepares it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.claims import ClaimRef
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from tests.client_faults import ClientFaults
from tests.kubeletplugin.conftest import (
    NODE,
    Dirs,
    create_claim,
    plugin_options,
    ref,
    registered_kubelet,
    running_plugin,
)
from tests.kubeletplugin.helpers import claim, result, stand_in_library
from tests.waiting import wait_for

HOSTILE = [
    ({"namespace": "default", "name": "x", "uid": ""}, "is not a Kubernetes UID"),
    ({"namespace": "default", "name": "x", "uid": ".."}, "is not a Kubernetes UID"),
    ({"namespace": "default", "name": "x", "uid": "../../etc"}, "is not a Kubernetes UID"),
    ({"namespace": "default", "name": "x", "uid": "a" * 5000}, "is not a Kubernetes UID"),
    ({"namespace": "../kube-system", "name": "x", "uid": "44444444-4444-4444-4444-444444444444"},
     "is not a valid namespace name"),
    ({"namespace": "default", "name": "x/../../y", "uid": "55555555-5555-5555-5555-555555555555"},
     "is not a valid ResourceClaim name"),
]  # fmt: skip


@pytest.fixture
def hami_plugin(dirs: Dirs, api_client: Any, tmp_path: Path) -> Iterator[KubeletPlugin]:
    """The plugin with HAMi-core enabled, so prepared claims own a directory under hami-core/claims."""
    library = stand_in_library(tmp_path / "libvgpu.so")
    with running_plugin(dirs, api_client, hami_core_lib=library) as running:
        yield running


@pytest.fixture
def hami_kubelet(hami_plugin: KubeletPlugin, protocol: KubeletProtocol) -> Iterator[PluginClient]:
    with registered_kubelet(hami_plugin, protocol) as client:
        yield client


def claims_dir(plugin: KubeletPlugin) -> Path:
    return plugin.options.plugin_dir / "hami-core" / "claims"


@pytest.mark.parametrize(("bad", "reason"), HOSTILE)
def test_unprepare_of_a_malformed_reference_touches_no_other_claim(
    hami_kubelet: PluginClient, hami_plugin: KubeletPlugin, api_client: Any, dirs: Dirs, bad: dict[str, str],
    reason: str,
) -> None:  # fmt: skip
    c = create_claim(api_client, claim("c1", [result("gpu-1", memory="1000Mi", cores=10)]))
    uid = c["metadata"]["uid"]
    assert hami_kubelet.prepare([ref(c)]).claims[uid].error == ""
    own_dir = claims_dir(hami_plugin) / uid
    assert own_dir.is_dir()
    (own_dir / "cudevshr.cache").write_text("in use")
    spec = dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json"

    response = hami_kubelet.unprepare([bad])
    assert reason in response.claims[bad["uid"]].error
    assert own_dir.is_dir() and (own_dir / "cudevshr.cache").read_text() == "in use"
    assert spec.is_file() and uid in hami_plugin.preparer.prepared()
    assert claims_dir(hami_plugin).is_dir()


@pytest.mark.parametrize(("bad", "reason"), HOSTILE)
def test_prepare_refuses_a_malformed_reference_per_claim(
    hami_kubelet: PluginClient, api_client: Any, bad: dict[str, str], reason: str
) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-1", memory="1000Mi", cores=10)]))
    uid = c["metadata"]["uid"]
    response = hami_kubelet.prepare([bad, ref(c)])
    assert reason in response.claims[bad["uid"]].error
    assert response.claims[uid].error == "" and len(response.claims[uid].devices) == 1


def test_a_claim_named_twice_is_answered_once(hami_kubelet: PluginClient, hami_plugin: KubeletPlugin,
                                              api_client: Any) -> None:  # fmt: skip
    c = create_claim(api_client, claim("c1", [result("gpu-1", memory="1000Mi", cores=10)]))
    uid = c["metadata"]["uid"]
    before = hami_plugin.metrics.requests.labels("prepare")._value.get()
    response = hami_kubelet.prepare([ref(c), ref(c)])
    assert list(response.claims) == [uid] and response.claims[uid].error == ""
    assert hami_plugin.metrics.requests.labels("prepare")._value.get() == before + 1


def test_claim_directory_is_never_built_from_a_non_uid(tmp_path: Path) -> None:
    config = HamiCoreConfig(tmp_path / "hami-core")
    for hostile in ("", "..", "../x", "/etc", "a/b"):
        with pytest.raises(ValueError, match="not a Kubernetes UID"):
            config.claim_dir(hostile)
    uid = "66666666-6666-6666-6666-666666666666"
    assert config.claim_dir(uid) == tmp_path / "hami-core" / "claims" / uid


def test_well_formed_references_pass() -> None:
    assert ClaimRef("team-a", "pod-gpu-x7k2p", "66666666-6666-6666-6666-666666666666").problem() is None
    assert ClaimRef("default", "a.b-c", "ABCDEF01-6666-6666-6666-666666666666").problem() is None


def _delete_claim(api_client: Any, created: dict[str, Any]) -> None:
    from kubernetes import client as k8s

    k8s.ResourceV1Api(api_client).delete_namespaced_resource_claim(
        created["metadata"]["name"], created["metadata"]["namespace"], _preload_content=False
    )


def test_a_claim_deleted_while_its_pod_runs_blocks_its_room_until_kubelet_unprepares_it(
    kubelet: PluginClient, plugin: KubeletPlugin, api_client: Any, dirs: Dirs
) -> None:
    """A tenant strips the finalizer and deletes a running pod's claim: the GPU stays taken."""
    running = create_claim(api_client, claim("running", [result("gpu-0", memory="10Gi", cores=10)]))
    uid = running["metadata"]["uid"]
    assert kubelet.prepare([ref(running)]).claims[uid].error == ""
    _delete_claim(api_client, running)
    second = create_claim(api_client, claim("second", [result("gpu-0", memory="10Gi", cores=10)]))
    error = kubelet.prepare([ref(second)]).claims[second["metadata"]["uid"]].error
    assert error.startswith("gpu-0 memory overcommitted: 10Gi prepared + 10Gi requested > ")
    assert "until kubelet unprepares it" in error
    assert uid in plugin.preparer.prepared()
    assert (dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json").exists()
    assert kubelet.unprepare([ref(running)]).claims[uid].error == ""  # the pod ended
    assert kubelet.prepare([ref(second)]).claims[second["metadata"]["uid"]].error == ""


def test_entries_of_claims_deleted_while_down_are_kept_and_reported_at_start_up(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = profile_gpus("t4", node_name=NODE, gpus=4)
    first = KubeletPlugin(plugin_options(dirs), gpus, api_client)
    first.start()
    client = PluginClient(protocol, first.servers.registration_socket)
    client.register()
    stale = create_claim(api_client, claim("stale", [result("gpu-1", memory="2000Mi", cores=10)]))
    uid = stale["metadata"]["uid"]
    assert client.prepare([ref(stale)]).claims[uid].error == ""
    client.close()
    first.stop()
    _delete_claim(api_client, stale)  # deleted while the plugin is down: kubelet unprepares when the pod ends
    second = KubeletPlugin(plugin_options(dirs), gpus, api_client)  # cleanup_seconds is an hour
    second.start()
    try:
        wait_for(lambda: second.preparer.deleted_claims() == {uid}, 10, "deleted claim reported at start-up")
        assert f"claim default/stale ({uid}) no longer exists in the API" in caplog.text
        assert uid in second.preparer.prepared()
        assert (dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json").exists()
    finally:
        second.stop()


def test_a_repeated_prepare_is_answered_from_the_checkpoint_without_reading_the_api(
    kubelet: PluginClient, api_client: Any, faults: ClientFaults
) -> None:
    c = create_claim(api_client, claim("again", [result("gpu-2", memory="1000Mi", cores=10)]))
    reads = faults.inject(r"/resourceclaims/again$", delay=0.001, count=None, methods={"GET"})
    first = kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]]
    for _ in range(3):
        again = kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]]
        assert again.error == "" and list(again.devices[0].cdi_device_ids) == list(
            first.devices[0].cdi_device_ids
        )
    assert reads.hits == 1, "kubelet repeats NodePrepareResources; each repeat must not cost an API read"
