"""kubelet's view over real unix sockets, with a client compiled from the upstream protos."""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.cluster.controlplane import ControlPlane
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from tests.client_faults import ClientFaults
from tests.kubeletplugin.conftest import Dirs, create_claim, ref, registered_kubelet, running_plugin
from tests.kubeletplugin.helpers import DRIVER, claim, read_spec, result, validate_cdi


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec.get("containerEdits", {}).get("env", []))


def test_registration(kubelet: PluginClient, plugin: KubeletPlugin, dirs: Dirs) -> None:
    info = kubelet.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(dirs.plugin / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]
    assert kubelet.plugin is not None and kubelet.plugin.service == "v1.DRAPlugin"
    assert plugin.registration.registered.is_set()
    reg = dirs.registry / f"{DRIVER}-reg.sock"
    for socket in (reg, dirs.plugin / "dra.sock"):
        mode = socket.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, socket
    assert stat.S_IMODE(dirs.plugin.stat().st_mode) == 0o700
    kubelet.notify(False, "validation failed")
    assert (
        not plugin.registration.registered.is_set() and plugin.registration.last_error == "validation failed"
    )


def test_prepare_v1_share(kubelet: PluginClient, api_client: Any, dirs: Dirs) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-2", memory="2000Mi", cores=25)]))
    uid = c["metadata"]["uid"]
    share_id = c["status"]["allocation"]["devices"]["results"][0]["shareID"]
    response = kubelet.prepare([ref(c)], version="v1")
    entry = response.claims[uid]
    assert entry.error == ""
    (device,) = entry.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == ("node-1", "gpu-2", ["gpu"])
    assert device.share_id == share_id
    assert list(device.cdi_device_ids) == [f"k8s.gpu.hami.io/gpu={uid}-gpu-2-{share_id}"]
    spec = read_spec(dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json")
    validate_cdi(spec)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "k8s.gpu.hami.io/gpu"
    env = env_of(spec)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m" and env["CUDA_DEVICE_SM_LIMIT_0"] == "25"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "hostPath": "/dev/null"}
    ]


def test_prepare_v1beta1_whole_gpu_and_subrequest(kubelet: PluginClient, api_client: Any, dirs: Dirs) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-0", share=False)]))
    uid = c["metadata"]["uid"]
    response = kubelet.prepare([ref(c)], version="v1beta1")
    (device,) = response.claims[uid].devices
    assert list(device.cdi_device_ids) == [f"k8s.gpu.hami.io/gpu={uid}-gpu-0"]
    assert not hasattr(device, "share_id") or not device.HasField("share_id")
    spec = read_spec(dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json")
    assert "containerEdits" not in spec or not env_of(spec)  # whole GPU: no HAMi-core edits
    validate_cdi(spec)


def test_prepare_is_idempotent_and_recreates_missing_spec(
    kubelet: PluginClient, api_client: Any, dirs: Dirs
) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-1"), result("gpu-3", request="other")]))
    first = kubelet.prepare([ref(c)])
    second = kubelet.prepare([ref(c)])
    assert first == second
    spec_path = dirs.cdi / f"k8s.gpu.hami.io-gpu_{c['metadata']['uid']}.json"
    content = spec_path.read_text()
    spec_path.unlink()
    assert kubelet.prepare([ref(c)]) == first
    assert spec_path.read_text() == content
    assert {tuple(d.request_names) for d in first.claims[c["metadata"]["uid"]].devices} == {
        ("gpu",),
        ("other",),
    }


def test_unprepare(kubelet: PluginClient, api_client: Any, dirs: Dirs, plugin: KubeletPlugin) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-1")]))
    kubelet.prepare([ref(c)])
    assert list(dirs.cdi.iterdir())
    unknown = {"namespace": "default", "name": "gone", "uid": "11111111-1111-1111-1111-111111111111"}
    response = kubelet.unprepare([ref(c), unknown])
    assert set(response.claims) == {c["metadata"]["uid"], unknown["uid"]}
    assert all(v.error == "" for v in response.claims.values())
    assert list(dirs.cdi.iterdir()) == [] and plugin.preparer.prepared() == {}
    assert kubelet.unprepare([ref(c)]).claims[c["metadata"]["uid"]].error == ""  # twice is fine


def test_unprepare_after_claim_deleted(kubelet: PluginClient, api_client: Any, dirs: Dirs) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-1")]))
    kubelet.prepare([ref(c)])
    k8s.ResourceV1Api(api_client).delete_namespaced_resource_claim("c1", "default", _preload_content=False)
    assert kubelet.unprepare([ref(c)]).claims[c["metadata"]["uid"]].error == ""
    assert list(dirs.cdi.iterdir()) == []


def test_claim_of_another_node_or_driver_or_deleted(
    kubelet: PluginClient, api_client: Any, dirs: Dirs
) -> None:
    other_node = create_claim(api_client, claim("other-node", [result("gpu-0", pool="node-2")]))
    other_driver = create_claim(api_client, claim("other-driver", [result("gpu-0", driver="gpu.nvidia.com")]))
    good = create_claim(api_client, claim("good", [result("gpu-0")]))
    missing = {"namespace": "default", "name": "missing", "uid": "22222222-2222-2222-2222-222222222222"}
    replaced = dict(ref(good), uid="33333333-3333-3333-3333-333333333333")
    response = kubelet.prepare([ref(other_node), ref(other_driver), ref(good), missing, replaced])
    errors = {uid: entry.error for uid, entry in response.claims.items()}
    assert "not to this node's pool node-1" in errors[other_node["metadata"]["uid"]]
    assert "no devices allocated by driver gpu.hami.io" in errors[other_driver["metadata"]["uid"]]
    assert "not found" in errors[missing["uid"]]
    assert "re-created" in errors[replaced["uid"]]
    assert errors[good["metadata"]["uid"]] == ""
    assert [p.name for p in dirs.cdi.iterdir()] == [f"k8s.gpu.hami.io-gpu_{good['metadata']['uid']}.json"]


def test_api_errors_are_per_claim_and_retriable(
    kubelet: PluginClient, api_client: Any, faults: ClientFaults
) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-0")]))
    faults.inject("/resourceclaims/c1", status=500, count=1, methods={"GET"})
    failed = kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]]
    assert "HTTP 500" in failed.error and not failed.devices
    assert kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]].error == ""


def test_last_line_of_defence(kubelet: PluginClient, api_client: Any, dirs: Dirs) -> None:
    big = create_claim(api_client, claim("big", [result("gpu-0", memory="10Gi", cores=60)]))
    whole = create_claim(api_client, claim("whole", [result("gpu-1", share=False)]))
    assert kubelet.prepare([ref(big), ref(whole)]).claims[big["metadata"]["uid"]].error == ""
    too_much_memory = create_claim(api_client, claim("mem", [result("gpu-0", memory="6Gi", cores=10)]))
    too_many_cores = create_claim(api_client, claim("cores", [result("gpu-0", memory="1Gi", cores=50)]))
    exclusive = create_claim(api_client, claim("excl", [result("gpu-0", share=False)]))
    onto_whole = create_claim(api_client, claim("onto", [result("gpu-1")]))
    fits = create_claim(api_client, claim("fits", [result("gpu-0", memory="4Gi", cores=40)]))
    response = kubelet.prepare(
        [ref(x) for x in (too_much_memory, too_many_cores, exclusive, onto_whole, fits)]
    )
    errors = {uid: e.error for uid, e in response.claims.items()}
    assert "memory overcommitted" in errors[too_much_memory["metadata"]["uid"]]
    assert "cores overcommitted" in errors[too_many_cores["metadata"]["uid"]]
    assert "requested exclusively" in errors[exclusive["metadata"]["uid"]]
    assert "allocated exclusively" in errors[onto_whole["metadata"]["uid"]]
    assert errors[fits["metadata"]["uid"]] == ""
    written = {p.name for p in dirs.cdi.iterdir()}
    assert len(written) == 3  # big, whole, fits


def test_concurrent_prepares(kubelet: PluginClient, api_client: Any, plugin: KubeletPlugin) -> None:
    claims = [
        create_claim(api_client, claim(f"c{i}", [result(f"gpu-{i % 4}", memory="1Gi", cores=10)]))
        for i in range(16)
    ]
    responses: list[Any] = []
    lock = threading.Lock()

    def worker(chunk: list[dict[str, Any]]) -> None:
        for c in chunk:
            response = kubelet.prepare([ref(c)])
            with lock:
                responses.append(response)

    threads = [threading.Thread(target=worker, args=(claims[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(responses) == 16
    assert all(entry.error == "" for r in responses for entry in r.claims.values())
    assert len(plugin.preparer.prepared()) == 16


def test_health_stream_and_file(kubelet: PluginClient, plugin: KubeletPlugin, dirs: Dirs) -> None:
    stream = kubelet.watch_health()
    first = next(stream)
    assert {(d.device.pool_name, d.device.device_name, d.health) for d in first.devices} == {
        ("node-1", f"gpu-{i}", 1) for i in range(4)
    }
    dirs.health.write_text("gpu-2: {healthy: false, message: XID 79}\n")
    update = next(stream)
    bad = {d.device.device_name: (d.health, d.message) for d in update.devices if d.health != 1}
    assert bad == {"gpu-2": (2, "XID 79")}
    dirs.health.write_text("gpu-2: healthy\n")
    assert all(d.health == 1 for d in next(stream).devices)
    stream.cancel()


def test_metrics(kubelet: PluginClient, api_client: Any, plugin: KubeletPlugin) -> None:
    from prometheus_client import generate_latest

    c = create_claim(api_client, claim("c1", [result("gpu-3", memory="3Gi", cores=20)]))
    kubelet.prepare([ref(c)])
    kubelet.prepare([{"namespace": "default", "name": "nope", "uid": "x"}])
    text = generate_latest(plugin.metrics.registry).decode()
    assert 'hami_dra_kubelet_plugin_requests_total{operation="prepare"} 2.0' in text
    assert 'hami_dra_kubelet_plugin_errors_total{operation="prepare"} 1.0' in text
    gpu3 = f'device="gpu-3",node="{plugin.options.node_name}"'
    assert f"hami_dra_kubelet_plugin_prepared_memory_bytes{{{gpu3}}} 3.221225472e+09" in text
    assert f"hami_dra_kubelet_plugin_prepared_cores{{{gpu3}}} 20.0" in text
    assert "hami_dra_kubelet_plugin_request_duration_seconds_bucket" in text
    # The allocation gauges are computed at scrape time: they follow an unprepare.
    kubelet.unprepare([ref(c)])
    text = generate_latest(plugin.metrics.registry).decode()
    assert f"hami_dra_kubelet_plugin_prepared_memory_bytes{{{gpu3}}} 0.0" in text
    assert "hami_dra_kubelet_plugin_prepared_devices 0.0" in text


def test_stop_removes_sockets(plugin: KubeletPlugin, dirs: Dirs) -> None:
    assert (dirs.registry / f"{DRIVER}-reg.sock").exists()
    plugin.stop()
    assert not (dirs.registry / f"{DRIVER}-reg.sock").exists() and not (dirs.plugin / "dra.sock").exists()


def test_stale_socket_replaced(dirs: Dirs, api_client: Any) -> None:
    from dra_driver.devices.simulated import profile_gpus
    from tests.kubeletplugin.conftest import plugin_options

    dirs.registry.mkdir(parents=True)
    stale = dirs.registry / f"{DRIVER}-reg.sock"
    stale.write_text("left over by a crash")
    running = KubeletPlugin(plugin_options(dirs), profile_gpus("t4", node_name="node-1", gpus=1), api_client)
    running.start()
    try:
        assert stat.S_ISSOCK(stale.stat().st_mode)
    finally:
        running.stop()
    assert not Path(stale).exists()


def test_nvml_mode_composes_the_toolkit_spec_into_the_claims_own(
    dirs: Dirs, api_client: Any, protocol: Any, tmp_path: Path
) -> None:
    """On real GPUs the claim's spec carries the toolkit's edits; kubelet gets our CDI IDs only."""
    import socket

    from dra_driver.devices.simulated import profile_gpus
    from tests.kubeletplugin.conftest import plugin_options
    from tests.kubeletplugin.toolkit_specs import host_root_with_libraries, toolkit_spec, write_toolkit_spec

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gpus = profile_gpus("a100-80gb", node_name="node-1", gpus=2)
    registry = tmp_path / "registry"
    write_toolkit_spec(registry, "index-only", [g.uuid for g in gpus], [0, 1])
    options = plugin_options(
        dirs,
        simulated=False,
        metrics_port=port,
        cdi_registry_dirs=(registry,),
        host_root=host_root_with_libraries(tmp_path / "host"),
    )
    running = KubeletPlugin(options, gpus, api_client)
    running.start()
    try:
        assert running.withheld == {}
        kubelet = PluginClient(protocol, running.servers.registration_socket)
        kubelet.register()
        c = create_claim(api_client, claim("c1", [result("gpu-1", share=False)]))
        (device,) = kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]].devices
        assert list(device.cdi_device_ids) == [f"k8s.gpu.hami.io/gpu={c['metadata']['uid']}-gpu-1"]
        spec = read_spec(dirs.cdi / f"k8s.gpu.hami.io-gpu_{c['metadata']['uid']}.json")
        toolkit = toolkit_spec("index-only", [g.uuid for g in gpus], [0, 1])
        assert spec["containerEdits"] == toolkit["containerEdits"]
        assert spec["devices"][0]["containerEdits"] == {
            "deviceNodes": [{"path": "/dev/nvidia1"}],
            "env": [f"HAMI_DRA_GPU_1_UUID={gpus[1].uuid}"],
        }
        # the lowest version that accepts the spec: 0.5.0 only because of a device name starting with a digit
        assert spec["cdiVersion"] == ("0.5.0" if c["metadata"]["uid"][0].isdigit() else "0.3.0")
        kubelet.close()
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert 'hami_dra_kubelet_plugin_requests_total{operation="prepare"} 1.0' in body
    finally:
        running.stop()


def test_nvml_mode_without_a_toolkit_spec_publishes_nothing_until_one_appears(
    dirs: Dirs, api_client: Any, protocol: Any, tmp_path: Path, caplog: Any
) -> None:
    """A pod placed there could not start: the GPUs are withheld, prepare says why, and they come back."""
    import logging

    from dra_driver.devices.simulated import profile_gpus
    from tests.kubeletplugin.conftest import plugin_options
    from tests.kubeletplugin.toolkit_specs import host_root_with_libraries, write_toolkit_spec
    from tests.waiting import wait_for

    gpus = profile_gpus("a100-80gb", node_name="node-1", gpus=2)
    registry = tmp_path / "registry"
    options = plugin_options(
        dirs,
        simulated=False,
        cdi_registry_dirs=(registry,),
        host_root=host_root_with_libraries(tmp_path / "host"),
        recheck_seconds=0.05,
    )
    with caplog.at_level(logging.ERROR):
        running = KubeletPlugin(options, gpus, api_client)
        running.start()
    try:
        assert sorted(running.withheld) == ["gpu-0", "gpu-1"]
        assert running._current_gpus() == []
        assert "NvidiaCdiSpecMissing: 2 GPU(s) not published" in caplog.text
        assert "nvidia-ctk cdi generate" in caplog.text
        kubelet = PluginClient(protocol, running.servers.registration_socket)
        kubelet.register()
        c = create_claim(api_client, claim("c1", [result("gpu-0", share=False)]))
        answer = kubelet.prepare([ref(c)]).claims[c["metadata"]["uid"]]
        assert not answer.devices and "no NVIDIA Container Toolkit CDI spec on this node" in answer.error
        kubelet.close()
        write_toolkit_spec(registry, "operator", [g.uuid for g in gpus], [0, 1])
        wait_for(lambda: not running.withheld, 10, "the GPUs published once the spec exists")
        assert [g.name for g in running._current_gpus()] == ["gpu-0", "gpu-1"]
    finally:
        running.stop()


def test_claim_reads_keep_connections_with_a_small_default_pool(
    node_room: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """A 1-CPU node's client default (5 connections) must not drop connections under 8 concurrent reads."""
    from kubernetes import config

    from dra_driver.kubeletplugin.claims import MIN_POOL_SIZE, ApiClaimSource, ClaimRef

    small = k8s.Configuration()
    config.load_kube_config(config_file=str(node_room.kubeconfig_path), client_configuration=small)
    small.connection_pool_maxsize = 2
    api_client = k8s.ApiClient(small)
    source = ApiClaimSource(api_client)
    assert api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == MIN_POOL_SIZE
    c = create_claim(api_client, claim("c1", [result("gpu-0")]))
    target = ClaimRef("default", "c1", c["metadata"]["uid"])
    barrier = threading.Barrier(8)

    def read() -> None:
        barrier.wait()
        for _ in range(5):
            assert source.get(target)["metadata"]["uid"] == target.uid

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [r for r in caplog.records if "Connection pool is full" in r.getMessage()]


def test_gpus_nothing_watches_are_unknown_to_kubelet_and_in_the_metrics(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    from prometheus_client import generate_latest

    # The health file says gpu-2 is bad, but health checks are off: nothing reads it.
    dirs.health.write_text("gpu-2: unhealthy\n")
    with (
        running_plugin(dirs, api_client, health_checks=False) as off,
        registered_kubelet(off, protocol) as kubelet,
    ):
        stream = kubelet.watch_health()
        first = next(stream)
        assert {d.device.device_name: d.health for d in first.devices} == {f"gpu-{i}": 0 for i in range(4)}
        stream.cancel()
        assert off.health.unmonitored() == [f"gpu-{i}" for i in range(4)]
        assert all(gpu.healthy and gpu.health_monitored is False for gpu in off._current_gpus())
        text = generate_latest(off.metrics.registry).decode()
        assert 'hami_dra_gpu_health_monitored{device="gpu-2",node="node-1"} 0.0' in text
        assert 'hami_dra_gpu_healthy{device="gpu-2",node="node-1"} 1.0' in text


def test_gpus_the_health_file_speaks_for_are_monitored(plugin: KubeletPlugin) -> None:
    from prometheus_client import generate_latest

    assert plugin.health.unmonitored() == []
    assert all(gpu.health_monitored is True for gpu in plugin._current_gpus())
    text = generate_latest(plugin.metrics.registry).decode()
    assert 'hami_dra_gpu_health_monitored{device="gpu-0",node="node-1"} 1.0' in text
