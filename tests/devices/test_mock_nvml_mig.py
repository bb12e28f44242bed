"""hack/mock-nvml's MIG, driven through the real pynvml bindings: profiles, placements, instance
create/destroy with NVML's error codes, MIG device handles and UUIDs.

Each test runs a script in a subprocess (the mock is loaded once per process, see conftest) that
prints JSON; the assertions hold the mock to what NVML answers on a real A100/H100.
"""

from __future__ import annotations

import json

import pytest
from mock_profiles import profile_from_gpus, with_mig

from dra_driver.devices.mig_profiles import MIG_MODELS
from dra_driver.devices.simulated import profile_gpus

H100 = MIG_MODELS["NVIDIA H100 80GB HBM3"]


def h100_profile(instances=(), *, enabled: bool = True) -> dict:
    gpus = profile_gpus("h100-80gb", node_name="node-1", gpus=2)
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][0] = with_mig(profile["devices"][0], instances, enabled=enabled)
    return profile


_PRELUDE = """
import json, sys
import pynvml as n
n.nvmlInit()
dev = n.nvmlDeviceGetHandleByIndex(0)
def code(fn, *args):
    try:
        fn(*args)
        return 0
    except n.NVMLError as err:
        return err.value
out = {}
"""


def run(run_nvml_script, body: str, profile: dict, **options) -> dict:
    proc = run_nvml_script(_PRELUDE + body + "\nprint(json.dumps(out))\n", profile, **options)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_profiles_answer_nvmls_numbers_by_profile_index(run_nvml_script) -> None:
    out = run(
        run_nvml_script,
        """
rows = []
for index in range(0x12):  # NVML 12.9's profile count (older bindings name fewer)
    try:
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
    except n.NVMLError as err:
        rows.append([index, err.value])
        continue
    rows.append([index, info.id, str(info.name), info.sliceCount, info.instanceCount,
                 info.multiprocessorCount, info.memorySizeMB])
out["rows"] = rows
v1 = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE, version=1)
out["v1"] = [v1.id, v1.sliceCount, v1.memorySizeMB]
out["beyond"] = code(n.nvmlDeviceGetGpuInstanceProfileInfo, dev, 0x12)
out["other_card"] = code(n.nvmlDeviceGetGpuInstanceProfileInfo, n.nvmlDeviceGetHandleByIndex(1), 0)
""",
        h100_profile(),
    )
    supported = {row[0]: row[1:] for row in out["rows"] if len(row) > 2}
    assert supported[0] == [19, "MIG 1g.10gb", 1, 7, 16, 9984]
    assert supported[9] == [15, "MIG 1g.20gb", 1, 4, 26, 20096]
    assert supported[1][:4] == [14, "MIG 2g.20gb", 2, 3]
    assert supported[2][:4] == [9, "MIG 3g.40gb", 3, 2]
    assert supported[3][:4] == [5, "MIG 4g.40gb", 4, 1]
    assert supported[4][:4] == [0, "MIG 7g.80gb", 7, 1]
    unsupported = {row[0]: row[1] for row in out["rows"] if len(row) == 2}
    assert set(unsupported.values()) == {3}  # NOT_SUPPORTED for profiles an H100 lacks
    assert out["v1"] == [9, 3, 40448]
    assert out["beyond"] == 2  # INVALID_ARGUMENT past the driver's profile count
    assert out["other_card"] == 3  # the second card is not in MIG mode


@pytest.mark.parametrize(
    ("name", "starts"),
    [("1g.10gb", [0, 1, 2, 3, 4, 5, 6]), ("1g.20gb", [0, 2, 4, 6]), ("2g.20gb", [0, 2, 4]),
     ("3g.40gb", [0, 4]), ("4g.40gb", [0]), ("7g.80gb", [0])],
)  # fmt: skip
def test_possible_placements_are_the_fixed_start_slots(run_nvml_script, name: str, starts: list[int]) -> None:
    profile_id = H100.by_name(name).profile_id
    out = run(
        run_nvml_script,
        f"""
from ctypes import byref, c_uint
count = c_uint(0)
n.nvmlDeviceGetGpuInstancePossiblePlacements(dev, {profile_id}, None, byref(count))
out["count"] = count.value
short = c_uint(count.value - 1)
array = (n.c_nvmlGpuInstancePlacement_t * count.value)()
out["short"] = code(n.nvmlDeviceGetGpuInstancePossiblePlacements, dev, {profile_id}, array, byref(short))
full = c_uint(count.value)
n.nvmlDeviceGetGpuInstancePossiblePlacements(dev, {profile_id}, array, byref(full))
out["placements"] = [[p.start, p.size] for p in array]
out["capacity"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, {profile_id})
""",
        h100_profile(),
    )
    size = H100.by_name(name).placement_size
    assert out["count"] == len(starts)
    assert out["placements"] == [[start, size] for start in starts]
    assert out["capacity"] == len(starts)
    assert out["short"] == 7  # INSUFFICIENT_SIZE for an array one too short


def test_create_with_placement_follows_nvmls_error_codes(run_nvml_script) -> None:
    g3, g1, g2, g7 = (H100.by_name(p).profile_id for p in ("3g.40gb", "1g.10gb", "2g.20gb", "7g.80gb"))
    out = run(
        run_nvml_script,
        f"""
from ctypes import byref  # the placement is a pointer in C; pynvml passes what it is given
def place(profile_id, start, size):
    p = n.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    try:
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, byref(p))
    except n.NVMLError as err:
        return err.value, None
    info = n.nvmlGpuInstanceGetInfo(gi)
    return 0, [info.id, info.profileId, info.placement.start, info.placement.size]
out["3g@4"] = place({g3}, 4, 4)
out["1g@5 overlaps"] = place({g1}, 5, 1)
out["2g@1 no such slot"] = place({g2}, 1, 2)
out["1g@2"] = place({g1}, 2, 1)
out["7g@0 overlaps"] = place({g7}, 0, 8)
out["cap_1g"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, {g1})
out["cap_3g"] = n.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, {g3})
out["unknown profile"] = place(77, 0, 1)
off = n.nvmlDeviceGetHandleByIndex(1)
p = n.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 1
out["mig off"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, off, {g1}, byref(p))
""",
        h100_profile(),
    )
    assert out["3g@4"] == [0, [2, H100.by_name("3g.40gb").profile_id, 4, 4]]
    assert out["1g@5 overlaps"][0] == 23  # INSUFFICIENT_RESOURCES
    assert out["2g@1 no such slot"][0] == 2  # INVALID_ARGUMENT
    assert out["1g@2"] == [0, [9, H100.by_name("1g.10gb").profile_id, 2, 1]]  # gi ids: 7 + start
    assert out["7g@0 overlaps"][0] == 23
    assert out["cap_1g"] == 3  # 0, 1 and 3 are left below the 3g
    assert out["cap_3g"] == 0
    assert out["unknown profile"][0] == 2
    assert out["mig off"] == 3  # NOT_SUPPORTED while MIG is off


def test_compute_instances_mig_devices_and_destroy_order(run_nvml_script) -> None:
    out = run(
        run_nvml_script,
        """
gi = n.nvmlDeviceGetGpuInstanceById(dev, 1)          # the profile's 3g.40gb at 0
ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
out["ci_profile"] = [ci_info.id, ci_info.sliceCount, ci_info.instanceCount, ci_info.multiprocessorCount,
                     str(ci_info.name)]
four = n.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE
out["ci_too_big"] = code(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, four, 0)
mig = n.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
out["mig"] = [n.nvmlDeviceIsMigDeviceHandle(mig).value, n.nvmlDeviceGetUUID(mig), n.nvmlDeviceGetName(mig),
              n.nvmlDeviceGetGpuInstanceId(mig), n.nvmlDeviceGetComputeInstanceId(mig),
              n.nvmlDeviceGetMemoryInfo(mig).total]
out["parent"] = n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig))
out["by_uuid"] = n.nvmlDeviceGetGpuInstanceId(n.nvmlDeviceGetHandleByUUID(out["mig"][1]))
out["whole_is_mig"] = n.nvmlDeviceIsMigDeviceHandle(dev).value
out["empty_slot"] = code(n.nvmlDeviceGetMigDeviceHandleByIndex, dev, 2)
out["past_max"] = code(n.nvmlDeviceGetMigDeviceHandleByIndex, dev, 7)
out["destroy_busy_gi"] = code(n.nvmlGpuInstanceDestroy, gi)
from ctypes import byref, c_uint
cis = (n.c_nvmlComputeInstance_t * 8)()
count = c_uint(0)
n.nvmlGpuInstanceGetComputeInstances(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, cis, byref(count))
out["cis"] = count.value
info = n.nvmlComputeInstanceGetInfo(cis[0])
out["ci_info"] = [info.id, info.profileId, info.placement.start, info.placement.size]
n.nvmlComputeInstanceDestroy(cis[0])
out["small"] = []
for _ in range(4):
    try:
        ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    except n.NVMLError as err:
        out["small"].append(err.value)
        continue
    i = n.nvmlComputeInstanceGetInfo(ci)
    out["small"].append([i.id, i.placement.start])
out["names"] = sorted(n.nvmlDeviceGetName(n.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)) for k in range(4))
for k in range(3):
    n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, k))
n.nvmlGpuInstanceDestroy(gi)
out["after"] = code(n.nvmlDeviceGetGpuInstanceById, dev, 1)
n.nvmlShutdown(); n.nvmlInit()   # the driver's state outlives a session
again = n.nvmlDeviceGetHandleByIndex(0)
out["still"] = n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(again, 13)).id
""",
        h100_profile([("3g.40gb", 0), ("1g.10gb", 6)]),
    )
    assert out["ci_profile"] == [0, 1, 3, 20, "MIG 1c.3g.40gb"]
    assert out["ci_too_big"] == 3
    uuid = out["mig"][1]
    assert uuid.startswith("MIG-") and len(uuid) == 40
    assert out["mig"][0] == 1 and out["mig"][2:] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1, 0, 40448 << 20]
    assert out["parent"] == h100_profile()["devices"][0]["uuid"]
    assert out["by_uuid"] == 1
    assert out["whole_is_mig"] == 0
    assert out["empty_slot"] == 6  # NOT_FOUND
    assert out["past_max"] == 2
    assert out["destroy_busy_gi"] == 19  # IN_USE while a compute instance lives
    assert out["cis"] == 1 and out["ci_info"] == [0, 2, 0, 3]
    assert out["small"] == [[0, 0], [1, 1], [2, 2], 23]
    card = "NVIDIA H100 80GB HBM3"
    assert out["names"] == [f"{card} MIG 1c.3g.40gb"] * 3 + [f"{card} MIG 1g.10gb"]
    assert out["after"] == 6
    assert out["still"] == 13


def test_mig_uuids_are_the_same_in_every_process(run_nvml_script) -> None:
    mig = "mig = lambda k: n.nvmlDeviceGetMigDeviceHandleByIndex(dev, k)\n"
    body = mig + 'out["uuids"] = [n.nvmlDeviceGetUUID(mig(k)) for k in [0, 1]]'
    profile = h100_profile([("1g.10gb", 0), ("1g.10gb", 1)])
    first, second = run(run_nvml_script, body, profile), run(run_nvml_script, body, profile)
    assert first == second and len(set(first["uuids"])) == 2


H200 = MIG_MODELS["NVIDIA H200"]


def h200_profile() -> dict:
    gpus = profile_gpus("h200", node_name="node-1", gpus=1)
    profile = profile_from_gpus(gpus, driver_version="550.54.15", cuda_driver_version=12040)
    profile["devices"][0] = with_mig(profile["devices"][0])
    return profile


def test_h200_profiles_and_placements(run_nvml_script) -> None:
    out = run(
        run_nvml_script,
        """
from ctypes import byref, c_uint
rows = {}
for index in (0, 9, 1, 2, 3, 4):
    info = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, index)
    count = c_uint(8)
    array = (n.c_nvmlGpuInstancePlacement_t * 8)()
    n.nvmlDeviceGetGpuInstancePossiblePlacements(dev, info.id, array, byref(count))
    rows[str(info.name)] = [info.sliceCount, info.instanceCount, info.memorySizeMB,
                            [[array[k].start, array[k].size] for k in range(count.value)]]
out["rows"] = rows
""",
        h200_profile(),
    )
    rows = out["rows"]
    assert rows["MIG 1g.18gb"][:2] == [1, 7]
    assert rows["MIG 1g.18gb"][3] == [[s, 1] for s in range(7)]
    assert rows["MIG 1g.35gb"][3] == [[0, 2], [2, 2], [4, 2], [6, 2]]
    assert rows["MIG 2g.35gb"][3] == [[0, 2], [2, 2], [4, 2]]
    assert rows["MIG 3g.71gb"][3] == [[0, 4], [4, 4]]
    assert rows["MIG 4g.71gb"][3] == [[0, 4]]
    assert rows["MIG 7g.141gb"][:2] == [7, 1] and rows["MIG 7g.141gb"][3] == [[0, 8]]
    assert rows["MIG 7g.141gb"][2] == H200.by_name("7g.141gb").memory_mib


def test_instances_outlive_the_process_with_a_state_file(run_nvml_script, tmp_path) -> None:
    """MOCK_NVML_MIG_STATE: as the kernel driver's, the instances one process creates are there for
    the next (the plugin restarted between create and checkpoint must find them), destroys too."""
    state = tmp_path / "mig-state"
    g1 = H100.by_name("1g.10gb").profile_id
    create = f"""
p = n.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 3, 1
from ctypes import byref
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(dev, {g1}, byref(p))
ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
out["uuid"] = n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(dev, 1))
"""
    listing = f"""
out["gis"] = sorted(n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(dev, i)).placement.start
                    for i in range(15) if code(n.nvmlDeviceGetGpuInstanceById, dev, i) == 0)
out["uuids"] = [n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(dev, k))
                for k in range(7) if code(n.nvmlDeviceGetMigDeviceHandleByIndex, dev, k) == 0]
out["again"] = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, dev, {g1}, byref(p))
"""
    placement = "\nfrom ctypes import byref\np = n.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 3, 1\n"
    destroy = """
gi = n.nvmlDeviceGetGpuInstanceById(dev, 10)
n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
n.nvmlGpuInstanceDestroy(gi)
"""
    profile = h100_profile([("1g.10gb", 0)])
    created = run(run_nvml_script, create, profile, mig_state=state)
    after = run(run_nvml_script, placement + listing, profile, mig_state=state)
    assert after["gis"] == [0, 3]
    assert created["uuid"] in after["uuids"] and len(after["uuids"]) == 2
    assert after["again"] == 23  # the slot is still taken in the new process
    run(run_nvml_script, destroy, profile, mig_state=state)
    gone = run(run_nvml_script, placement + listing, profile, mig_state=state)
    assert gone["gis"] == [0] and len(gone["uuids"]) == 1
    without = run(run_nvml_script, placement + listing, profile)
    assert without["gis"] == [0]  # no state file: each process starts from the profile
