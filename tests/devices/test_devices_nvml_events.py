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

from dra_driver.devices.nvml_events import parse_xids
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
ignored = json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
state = HealthState([gpu.name for gpu in gpus])
watcher = NvmlHealthWatcher(
    {gpu.name: gpu.uuid for gpu in gpus}, state, ignored_xids=ignored, wait_ms=50, retry_s=0.05
)
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
    "unmonitored": state.unmonitored(),
    "unhealthy": {name: value.message for name, value in health.items() if not value.healthy},
    "released": released,
}))
"""


def watch(
    run_nvml_script,
    events: str,
    until: list[str],
    profile: dict[str, Any] | None = None,
    ignored: list[int] | None = None,
):
    args = [json.dumps(until), json.dumps(ignored or [])]
    proc = run_nvml_script(_WATCH, profile or node_profile(), *args, events=events)
    result = json.loads(proc.stdout)
    assert not result["alive"], "the watcher did not stop"
    assert result["released"], "the watcher kept NVML initialised after it stopped"
    return result, proc.stderr


def test_xid_79_marks_that_gpu_unhealthy(run_nvml_script) -> None:
    result, log = watch(run_nvml_script, "2 xid 79\n", until=["gpu-2"])
    assert result["started"] and result["monitored"] == NAMES and result["unmonitored"] == []
    assert result["unhealthy"] == {"gpu-2": "XID 79"}
    assert f"gpu-2 ({GPUS[2].uuid}): XID 79; marking it unhealthy" in log


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(run_nvml_script, xid: int) -> None:
    # XID 48 on gpu-3 comes after: once it is handled, the application XID was too.
    result, log = watch(run_nvml_script, f"0 xid {xid}\n3 xid 48\n", until=["gpu-3"])
    assert result["unhealthy"] == {"gpu-3": "XID 48"}
    assert f"gpu-0: XID {xid} is an application error; the GPU stays healthy" in log


def test_ecc_events_are_logged_not_acted_on_as_nvidia_does(run_nvml_script) -> None:
    # NVIDIA's plugins register ECC events and act on XIDs only: an uncorrectable error the card
    # cannot contain raises its own XID (48 here), which marks the GPU.
    result, log = watch(run_nvml_script, "0 sbe\n1 dbe\n2 dbe\n2 xid 48\n", until=["gpu-2"])
    assert result["unhealthy"] == {"gpu-2": "XID 48"}
    assert "gpu-1: double-bit ECC error; not acted on" in log


def test_additional_xids_to_ignore_leave_the_gpu_healthy(run_nvml_script) -> None:
    result, log = watch(run_nvml_script, "0 xid 79\n1 xid 63\n2 xid 48\n", until=["gpu-2"], ignored=[79, 63])
    assert result["unhealthy"] == {"gpu-2": "XID 48"}
    assert "gpu-0: XID 79 is in --additional-xids-to-ignore; the GPU stays healthy" in log
    assert "gpu-1: XID 63 is in --additional-xids-to-ignore" in log
    assert "XIDs ignored: 13, 31, 43, 45, 63, 68, 79, 109" in log


@pytest.mark.parametrize(
    ("text", "xids"), [("", set()), ("79", {79}), (" 79, 48 ,", {48, 79}), ("79 48", {48, 79})]
)
def test_xid_lists_parse(text: str, xids: set[int]) -> None:
    assert parse_xids(text) == xids


@pytest.mark.parametrize("text", ["79,x", "-1", "0", "4.8"])
def test_a_bad_xid_list_is_refused_with_the_bad_value(text: str) -> None:
    with pytest.raises(ValueError, match="is not an XID"):
        parse_xids(text)


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


@pytest.mark.parametrize("events", [0x1, 0x3])  # ECC events alone are not acted on: not monitored
def test_a_gpu_without_xid_events_is_not_monitored(run_nvml_script, events: int) -> None:
    profile = node_profile()
    profile["devices"][0]["supportedEvents"] = events
    result, log = watch(run_nvml_script, "3 xid 79\n", until=["gpu-3"], profile=profile)
    assert result["monitored"] == ["gpu-1", "gpu-2", "gpu-3"]
    assert result["unmonitored"] == ["gpu-0"]
    assert f"gpu-0 ({GPUS[0].uuid}) is not monitored: NVML offers no XID events for it" in log


def test_when_no_gpu_registers_the_watcher_says_so_and_gives_nvml_back(run_nvml_script) -> None:
    profile = node_profile()
    profile["errors"] = {"nvmlDeviceRegisterEvents": 999}
    result, log = watch(run_nvml_script, "", until=[], profile=profile)
    assert not result["started"] and result["monitored"] == []
    assert result["unmonitored"] == NAMES
    assert "GPU health is not monitored: no GPU could register for NVML events" in log


_RECOVER = """
import json, logging, os, time
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from dra_driver.devices.nvml import NvmlSource
from dra_driver.kubeletplugin.health import HealthState, NvmlHealthWatcher
gpus = NvmlSource().discover()
state = HealthState([gpu.name for gpu in gpus])
watcher = NvmlHealthWatcher(
    {gpu.name: gpu.uuid for gpu in gpus}, state, recovery_s=0.3, wait_ms=50, retry_s=0.05
)
deadline = time.monotonic() + 30
def wait(condition):
    while not condition():
        assert time.monotonic() < deadline, (state.snapshot(), watcher.events.not_recovered)
        time.sleep(0.02)
def unhealthy():
    return {name: value.message for name, value in state.snapshot()[1].items() if not value.healthy}
seen = []
watcher.start()
# gpu-1: a contained ECC error (XID 94): the card is fine once the process is gone.
# gpu-2: XID 48 with a row remap pending: bad until reset. gpu-3: fell off the bus.
wait(lambda: set(unhealthy()) == {"gpu-1", "gpu-2", "gpu-3"})
seen.append(unhealthy())
wait(lambda: "gpu-1" not in unhealthy() and {"gpu-2", "gpu-3"} <= set(watcher.events.not_recovered))
seen.append(unhealthy())
seen.append(watcher.events.not_recovered)
seen.append(state.snapshot()[1]["gpu-1"].message)
with open(os.environ["MOCK_NVML_EVENTS"], "a") as events:
    events.write("2 reset\\n3 reset\\n")
wait(lambda: not unhealthy())
watcher.stop()
print(json.dumps(seen))
"""


def test_a_marked_gpu_recovers_once_nvml_reaches_it_and_no_reset_is_pending(run_nvml_script) -> None:
    events = "1 xid 94\n2 remap-pending\n2 xid 48\n3 fallen\n3 xid 79\n"
    proc = run_nvml_script(_RECOVER, node_profile(), events=events)
    marked, after_window, still_bad, message = json.loads(proc.stdout)
    assert marked == {"gpu-1": "XID 94", "gpu-2": "XID 48", "gpu-3": "XID 79"}
    assert after_window == {"gpu-2": "XID 48", "gpu-3": "XID 79"}
    assert still_bad == {
        "gpu-2": "row remapping is pending: reset the GPU",
        "gpu-3": "NVML cannot reach it (GPU is lost)",
    }
    assert message == "recovered"
    assert "gpu-1 recovered: no XID for 0.3s, NVML reaches it and no reset is pending" in proc.stderr
    assert "gpu-2 stays unhealthy: row remapping is pending: reset the GPU" in proc.stderr


def test_pages_pending_retirement_keep_an_older_gpu_unhealthy(run_nvml_script) -> None:
    # Before Ampere NVML has no row remapping; page retirement says a reset is due.
    gpus = profile_gpus("t4", node_name="node-1", gpus=4)
    profile = profile_from_gpus(gpus, driver_version="535.104.05", cuda_driver_version=12020)
    events = "1 xid 94\n2 remap-pending\n2 xid 48\n3 fallen\n3 xid 79\n"
    proc = run_nvml_script(_RECOVER, profile, events=events)
    _, after_window, still_bad, _ = json.loads(proc.stdout)
    assert after_window == {"gpu-2": "XID 48", "gpu-3": "XID 79"}
    assert still_bad["gpu-2"] == "pages are pending retirement: reset the GPU"
