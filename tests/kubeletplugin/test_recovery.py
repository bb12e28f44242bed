"""A kill -9 at each point of a prepare call, corrupt checkpoint, reboot, clean shutdown, CLI errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.checkpoint import CURRENT_VERSION, PREPARE_COMPLETED, Checkpoint
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from dra_driver.kubeletplugin.prepare import FAILPOINT_ENV, FAILPOINTS
from hami_dra_dev.cluster.controlplane import ControlPlane
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from tests.client_faults import ClientFaults
from tests.kubeletplugin.conftest import NODE, Dirs, create_claim, plugin_options, ref
from tests.kubeletplugin.helpers import DRIVER, claim, result
from tests.kubeletplugin.upstream import REPO_ROOT
from tests.waiting import wait_for

#: The console script, without depending on where it was installed (``python -m`` would load the CLI twice).
HAMI_DRA = [sys.executable, "-c", "import sys; from dra_driver.cli import main; sys.exit(main())"]


class PluginProcess:
    """``hami-dra kubelet-plugin`` as a child process, the way the DaemonSet runs it."""

    def __init__(self, dirs: Dirs, kubeconfig: Path, env: dict[str, str] | None = None) -> None:
        cmd = [
            *HAMI_DRA, "kubelet-plugin",
            "--node-name", NODE, "--source", "simulated", "--profile", "t4", "--gpus", "4",
            "--kubeconfig", str(kubeconfig), "--publish=false",
            "--plugin-dir", str(dirs.plugin), "--registry-dir", str(dirs.registry),
            "--cdi-dir", str(dirs.cdi),
            "--boot-id-file", str(dirs.boot_id),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd,
            cwd=REPO_ROOT,
            env=dict(os.environ, **(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready:"):
            self.process.kill()
            raise AssertionError(
                f"plugin did not start: {line}{self.process.stderr.read() if self.process.stderr else ''}"
            )
        self.registration_socket = Path(line.split(":", 1)[1].strip())

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def processes() -> Iterator[list[PluginProcess]]:
    started: list[PluginProcess] = []
    yield started
    for process in started:
        process.kill()


def connect(protocol: KubeletProtocol, socket: Path) -> PluginClient:
    client = PluginClient(protocol, socket)
    client.register()
    return client


#: After a kill at each point of a call, what the restarted plugin finds for each of its claims:
#: (checkpoint state, CDI spec present). Before the checkpoint write nothing holds a share.
AFTER_KILL_AT = {
    "after-admission": (None, False),
    "after-side-effects": (None, True),  # never answered: kubelet retries or unprepares it
    "after-checkpoint": (PREPARE_COMPLETED, True),  # durable before the answer that never came
}


@pytest.mark.parametrize("point", FAILPOINTS)
def test_a_kill_at_each_point_of_a_call_is_completed_by_kubelets_retry(
    dirs: Dirs,
    node_room: ControlPlane,
    api_client: Any,
    protocol: KubeletProtocol,
    processes: list[PluginProcess],
    point: str,
) -> None:
    objs = [
        create_claim(api_client, claim("c1", [result("gpu-1", share=False)])),
        create_claim(api_client, claim("c2", [result("gpu-2", memory="4Gi")])),
    ]
    uids = [c["metadata"]["uid"] for c in objs]
    crashing = PluginProcess(dirs, node_room.kubeconfig_path, {FAILPOINT_ENV: point})
    processes.append(crashing)
    kubelet = connect(protocol, crashing.registration_socket)
    with pytest.raises(grpc.RpcError):
        kubelet.prepare([ref(c) for c in objs], timeout=10)
    assert crashing.process.wait(10) == -signal.SIGKILL
    kubelet.close()
    path = dirs.plugin / "checkpoint.json"
    entries = Checkpoint(path).load() if path.exists() else {}
    spec_of = {uid: dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json" for uid in uids}
    found = [(entries[uid].state if uid in entries else None, spec_of[uid].exists()) for uid in uids]
    assert found == [AFTER_KILL_AT[point]] * 2

    restarted = PluginProcess(dirs, node_room.kubeconfig_path)
    processes.append(restarted)
    kubelet = connect(protocol, restarted.registration_socket)
    response = kubelet.prepare([ref(c) for c in objs])  # kubelet's retry, the same call
    assert [response.claims[uid].error for uid in uids] == ["", ""]
    assert {u: e.state for u, e in Checkpoint(path).load().items()} == dict.fromkeys(uids, PREPARE_COMPLETED)
    assert all(spec.exists() for spec in spec_of.values())
    # the retried claims hold their room: a rival for the exclusive card is refused
    rival = create_claim(api_client, claim("rival", [result("gpu-1", memory="1Gi")]))
    assert "allocated exclusively" in kubelet.prepare([ref(rival)]).claims[rival["metadata"]["uid"]].error
    # and kubelet's unprepare when the pod ends clears every trace
    assert [e.error for e in kubelet.unprepare([ref(c) for c in objs]).claims.values()] == ["", ""]
    assert Checkpoint(path).load() == {} and not list(dirs.cdi.glob("*.json"))
    assert not list((dirs.plugin / "prepared").glob("*.json"))
    kubelet.close()
    assert restarted.terminate() == 0
    # clean shutdown removed both sockets (deregistration)
    assert not (dirs.registry / f"{DRIVER}-reg.sock").exists() and not (dirs.plugin / "dra.sock").exists()


def test_a_call_killed_before_its_checkpoint_write_is_cleared_by_kubelets_unprepare(
    dirs: Dirs,
    node_room: ControlPlane,
    api_client: Any,
    protocol: KubeletProtocol,
    processes: list[PluginProcess],
) -> None:
    """The pod is deleted while the plugin is down: kubelet never retries, it unprepares."""
    c = create_claim(api_client, claim("c1", [result("gpu-0", share=False)]))
    uid = c["metadata"]["uid"]
    crashing = PluginProcess(dirs, node_room.kubeconfig_path, {FAILPOINT_ENV: "after-side-effects"})
    processes.append(crashing)
    kubelet = connect(protocol, crashing.registration_socket)
    with pytest.raises(grpc.RpcError):
        kubelet.prepare([ref(c)], timeout=10)
    assert crashing.process.wait(10) == -signal.SIGKILL
    kubelet.close()
    assert (dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json").exists()

    restarted = PluginProcess(dirs, node_room.kubeconfig_path)
    processes.append(restarted)
    kubelet = connect(protocol, restarted.registration_socket)
    # the share was never counted: another claim on the card is prepared at once
    other = create_claim(api_client, claim("other", [result("gpu-0", share=False)]))
    assert kubelet.prepare([ref(other)]).claims[other["metadata"]["uid"]].error == ""
    assert kubelet.unprepare([ref(c)]).claims[uid].error == ""
    assert [p.name for p in dirs.cdi.glob("*.json")] == [
        f"k8s.gpu.hami.io-gpu_{other['metadata']['uid']}.json"
    ]
    assert not (dirs.plugin / "prepared" / f"{uid}.json").exists()
    assert set(Checkpoint(dirs.plugin / "checkpoint.json").load()) == {other["metadata"]["uid"]}
    kubelet.close()


def start_plugin(dirs: Dirs, api_client: Any) -> KubeletPlugin:
    plugin = KubeletPlugin(plugin_options(dirs), profile_gpus("t4", node_name=NODE, gpus=4), api_client)
    plugin.start()
    return plugin


def test_corrupt_checkpoint_is_rebuilt_from_the_node_reading_claims_with_get_only(
    dirs: Dirs,
    faults: ClientFaults,
    api_client: Any,
    protocol: KubeletProtocol,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kubernetes import client as k8s

    listing = faults.inject(r"/resourceclaims$", status=403, count=None, methods={"GET"})  # no list right
    reserved = create_claim(api_client, claim("in-use", [result("gpu-0", share=False)]), reserved_for="pod-a")
    gone = create_claim(api_client, claim("gone", [result("gpu-1", memory="12000Mi")]), reserved_for="pod-b")
    plugin = start_plugin(dirs, api_client)
    kubelet = connect(protocol, plugin.servers.registration_socket)
    first = kubelet.prepare([ref(reserved), ref(gone)])
    kubelet.close()
    plugin.stop()
    # pod-b runs on, but its claim is deleted from the API (finalizer stripped) while the plugin is down
    k8s.ResourceV1Api(api_client).delete_namespaced_resource_claim("gone", "default", _preload_content=False)
    checkpoint = dirs.plugin / "checkpoint.json"
    checkpoint.write_text(checkpoint.read_text()[:40] + "garbage")

    plugin = start_plugin(dirs, api_client)
    try:
        assert "corrupt checkpoint" in caplog.text
        assert list(dirs.plugin.glob("checkpoint.json.corrupt-*"))
        uid, gone_uid = reserved["metadata"]["uid"], gone["metadata"]["uid"]
        assert {u: e.state for u, e in plugin.preparer.prepared().items()} == {
            uid: PREPARE_COMPLETED,
            gone_uid: PREPARE_COMPLETED,
        }
        # the start-up check reads each claim with get and flags the deleted one, keeping it
        wait_for(lambda: plugin.preparer.deleted_claims() == {gone_uid}, 10, "deleted claim reported")
        assert (
            f"claim default/gone ({gone_uid}) no longer exists in the API but is still prepared"
            in caplog.text
        )
        kubelet = connect(protocol, plugin.servers.registration_socket)
        assert kubelet.prepare([ref(reserved)]).claims[uid] == first.claims[uid]
        # the rebuilt state still defends both GPUs
        rival = create_claim(api_client, claim("rival", [result("gpu-0")]))
        assert "allocated exclusively" in kubelet.prepare([ref(rival)]).claims[rival["metadata"]["uid"]].error
        squeeze = create_claim(api_client, claim("squeeze", [result("gpu-1", memory="4000Mi")]))
        error = kubelet.prepare([ref(squeeze)]).claims[squeeze["metadata"]["uid"]].error
        assert "gpu-1 memory overcommitted" in error
        kubelet.close()
        assert listing.hits == 0
    finally:
        plugin.stop()


def test_reboot_reprepares_with_empty_cdi_dir(dirs: Dirs, api_client: Any, protocol: KubeletProtocol) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-2", memory="4Gi", cores=50)]))
    uid = c["metadata"]["uid"]
    plugin = start_plugin(dirs, api_client)
    kubelet = connect(protocol, plugin.servers.registration_socket)
    before = kubelet.prepare([ref(c)])
    spec_path = dirs.cdi / f"k8s.gpu.hami.io-gpu_{uid}.json"
    spec = spec_path.read_text()
    kubelet.close()
    plugin.stop()

    dirs.boot_id.write_text("boot-2\n")  # reboot: new boot ID, tmpfs CDI dir wiped
    for path in dirs.cdi.iterdir():
        path.unlink()
    plugin = start_plugin(dirs, api_client)
    try:
        assert plugin.preparer.prepared()[uid].boot_id == "boot-1"  # kept, but not trusted
        kubelet = connect(protocol, plugin.servers.registration_socket)
        assert kubelet.prepare([ref(c)]) == before
        assert spec_path.read_text() == spec
        assert plugin.preparer.prepared()[uid].boot_id == "boot-2"
        kubelet.close()
    finally:
        plugin.stop()


def test_the_periodic_check_reports_deleted_claims_and_only_kubelet_unprepares_them(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    from kubernetes import client as k8s

    keep = create_claim(api_client, claim("keep", [result("gpu-0")]))
    gone = create_claim(api_client, claim("gone", [result("gpu-1")]))
    spec_of = {c["metadata"]["uid"]: f"k8s.gpu.hami.io-gpu_{c['metadata']['uid']}.json" for c in (keep, gone)}
    plugin = start_plugin(dirs, api_client)
    try:
        kubelet = connect(protocol, plugin.servers.registration_socket)
        kubelet.prepare([ref(keep), ref(gone)])
        k8s.ResourceV1Api(api_client).delete_namespaced_resource_claim(
            "gone", "default", _preload_content=False
        )
        assert plugin.preparer.report_deleted() == [gone["metadata"]["uid"]]
        assert set(plugin.preparer.prepared()) == set(spec_of)  # its pod may still run
        assert sorted(p.name for p in dirs.cdi.iterdir()) == sorted(spec_of.values())
        assert kubelet.unprepare([ref(gone)]).claims[gone["metadata"]["uid"]].error == ""  # the pod ended
        kubelet.close()
        assert set(plugin.preparer.prepared()) == {keep["metadata"]["uid"]}
        assert [p.name for p in dirs.cdi.iterdir()] == [spec_of[keep["metadata"]["uid"]]]
        assert plugin.preparer.deleted_claims() == set()
    finally:
        plugin.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "simulated", "--profile", "t4"], "--node-name"),
        (["--node-name", "n"], "--source nvml|simulated is required"),
        (["--node-name", "n", "--source", "simulated"], "--profile"),
        (
            ["--node-name", "n", "--source", "simulated", "--profile", "t4", "--kubeconfig", "/nonexistent"],
            "cannot load",
        ),
    ],
)
def test_cli_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBECONFIG")}
    run = subprocess.run(
        [*HAMI_DRA, "kubelet-plugin", *args],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert message in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_checkpoint_file_is_valid_json_with_checksum(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    c = create_claim(api_client, claim("c1", [result("gpu-0")]))
    plugin = start_plugin(dirs, api_client)
    try:
        kubelet = connect(protocol, plugin.servers.registration_socket)
        kubelet.prepare([ref(c)])
        kubelet.close()
        document = json.loads((dirs.plugin / "checkpoint.json").read_text())
        assert document["version"] == CURRENT_VERSION and len(document["checksum"]) == 64
        assert document["claims"][c["metadata"]["uid"]]["bootID"] == "boot-1"
    finally:
        plugin.stop()
