"""NVML's init reference count and the health watcher, against hack/mock-nvml through real pynvml.

Each test runs in a fresh subprocess (see conftest.py). The watcher tests run discovery first, as
the kubelet plugin does, then :class:`NvmlHealthWatcher`; events come from the mock's events file
and are read in order, so "event A ignored" is proven by a later event B having been handled.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mock_profiles import profile_from_gpus

from dra_driver.devices.simulated import profile_gpus

GPUS = profile_gpus("h100-80gb", node_name="node-1", gpus=4)
NAMES = [f"gpu-{gpu.index}" for gpu in GPUS]


def node_profile() -> dict[str, Any]:
    return profile_from_gpus(GPUS, driver_version="550.54.15", cuda_driver_version=12040)


_REFCOUNT = """
import json, pynvml
def count():
    try:
        return pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        return str(err)
def shutdown():
    try:
        pynvml.nvmlShutdown()
        return "ok"
    except pynvml.NVMLError as err:
        return str(err)
steps = []
pynvml.nvmlInit(); pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
steps.append(count())
steps.append(shutdown()); steps.append(count())          # one reference left: still usable
steps.append(shutdown()); steps.append(count())          # the last one: uninitialised
try:
    pynvml.nvmlDeviceGetUUID(handle)                     # a handle from before is no good either
except pynvml.NVMLError as err:
    steps.append(str(err))
steps.append(shutdown())                                 # one shutdown too many
pynvml.nvmlInit(); steps.append(count()); pynvml.nvmlShutdown()
print(json.dumps(steps))
"""


def test_the_mock_counts_initialisations_like_the_real_library(run_nvml_script) -> None:
    proc = run_nvml_script(_REFCOUNT, node_profile())
    assert json.loads(proc.stdout) == [
        4, "ok", 4, "ok", "Uninitialized", "Uninitialized", "Uninitialized", 4,
    ]  # fmt: skip


_DISCOVER_UNDER_A_HELD_INIT = """
import json, pynvml
from dra_driver.devices.nvml import NvmlSource
pynvml.nvmlInit()                                       # someone else (the watcher) holds NVML
gpus = NvmlSource().discover()
count = pynvml.nvmlDeviceGetCount()                     # discovery gave back only its own init
pynvml.nvmlShutdown()
try:
    pynvml.nvmlDeviceGetCount()
    after = "still initialised"
except pynvml.NVMLError_Uninitialized:
    after = "Uninitialized"
print(json.dumps([len(gpus), count, after]))
"""


def test_discovery_gives_back_only_its_own_initialisation(run_nvml_script) -> None:
    proc = run_nvml_script(_DISCOVER_UNDER_A_HELD_INIT, node_profile())
    assert json.loads(proc.stdout) == [4, 4, "Uninitialized"]


_WATCH = """
import json, logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
import pynvml
from dra_driver.devices.nvml import NvmlSource
from dra_driver.kubeletplugin.health import HealthState, NvmlHealthWatcher
gpus = NvmlSource().discover()                          # nvmlInit ... nvmlShutdown, as the plugin starts
until = set(json.loads(sys.argv[1]))
state = HealthState([gpu.name for gpu in gpus])
watcher = NvmlHealthWatcher({gpu.name: gpu.uuid for gpu in gpus}, state, wait_ms=50, retry_s=0.05)
thread = watcher.start()
deadline = time.monotonic() + 20
while thread is not None:
    version, health = state.snapshot()
    if until <= {name for name, value in health.items() if not value.healthy}:
        break
    if time.monotonic() >= deadline:
        break
    state.wait_change(version, timeout=deadline - time.monotonic())
watcher.stop()
if thread is not None:
    thread.join(10)
try:
    pynvml.nvmlDeviceGetCount()
    released = False
except pynvml.NVMLError_Uninitialized:
    released = True
_, health = state.snapshot()
print(json.dumps({
    "started": thread is not None,
    "alive": thread is not None and thread.is_alive(),
    "monitored": list(watcher.monitored),
    "unhealthy": {name: value.message for name, value in health.items() if not value.healthy},
    "released": released,
}))
"""


def watch(run_nvml_script, events: str, until: list[str], profile: dict[str, Any] | None = None):
    proc = run_nvml_script(_WATCH, profile or node_profile(), json.dumps(until), events=events)
    result = json.loads(proc.stdout)
    assert not result["alive"], "the watcher did not stop"
    assert result["released"], "the watcher kept NVML initialised after it stopped"
    return result, proc.stderr


def test_xid_79_marks_that_gpu_unhealthy(run_nvml_script) -> None:
    result, log = watch(run_nvml_script, "2 xid 79\n", until=["gpu-2"])
    assert result["started"] and result["monitored"] == NAMES
    assert result["unhealthy"] == {"gpu-2": "XID 79"}
    assert f"gpu-2 ({GPUS[2].uuid}): XID 79; marking it unhealthy" in log


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(run_nvml_script, xid: int) -> None:
    # XID 48 on gpu-3 comes after: once it is handled, the application XID was too.
    result, log = watch(run_nvml_script, f"0 xid {xid}\n3 xid 48\n", until=["gpu-3"])
    assert result["unhealthy"] == {"gpu-3": "XID 48"}
    assert f"gpu-0: XID {xid} is an application error; the GPU stays healthy" in log


def test_a_double_bit_ecc_error_marks_that_gpu_unhealthy(run_nvml_script) -> None:
    # A single-bit error is corrected by the hardware: not registered, never reported.
    result, _ = watch(run_nvml_script, "0 sbe\n1 dbe\n", until=["gpu-1"])
    assert result["unhealthy"] == {"gpu-1": "double-bit ECC error"}


def test_a_lost_gpu_marks_every_gpu_unhealthy(run_nvml_script) -> None:
    result, log = watch(run_nvml_script, "lost\n", until=NAMES)
    assert result["unhealthy"] == dict.fromkeys(NAMES, "GPU lost")
    assert "a GPU is lost" in log


def test_a_failed_wait_is_logged_and_watching_goes_on(run_nvml_script) -> None:
    result, log = watch(run_nvml_script, "error 999\n1 xid 79\n", until=["gpu-1"])
    assert result["unhealthy"] == {"gpu-1": "XID 79"}
    assert "waiting for NVML events failed (Unknown Error)" in log


@pytest.mark.parametrize(
    "call", ["nvmlDeviceGetHandleByUUID", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents"]
)
def test_one_gpu_failing_registration_leaves_the_others_watched(run_nvml_script, call: str) -> None:
    profile = node_profile()
    profile["devices"][1]["errors"] = {call: 999}
    # gpu-1's event is never delivered (it is not registered); gpu-2's is.
    result, log = watch(run_nvml_script, "1 xid 79\n2 xid 79\n", until=["gpu-2"], profile=profile)
    assert result["monitored"] == ["gpu-0", "gpu-2", "gpu-3"]
    assert result["unhealthy"] == {"gpu-2": "XID 79"}
    assert f"gpu-1 ({GPUS[1].uuid}) is not monitored: NVML health events could not be registered" in log


def test_a_gpu_without_health_events_is_not_monitored(run_nvml_script) -> None:
    profile = node_profile()
    profile["devices"][0]["supportedEvents"] = 0x1  # single-bit ECC only
    result, log = watch(run_nvml_script, "3 xid 79\n", until=["gpu-3"], profile=profile)
    assert result["monitored"] == ["gpu-1", "gpu-2", "gpu-3"]
    assert f"gpu-0 ({GPUS[0].uuid}) is not monitored: NVML offers neither XID nor ECC events" in log


def test_when_no_gpu_registers_the_watcher_says_so_and_gives_nvml_back(run_nvml_script) -> None:
    profile = node_profile()
    profile["errors"] = {"nvmlDeviceRegisterEvents": 999}
    result, log = watch(run_nvml_script, "", until=[], profile=profile)
    assert not result["started"] and result["monitored"] == []
    assert "GPU health is not monitored: no GPU could register for NVML events" in log
