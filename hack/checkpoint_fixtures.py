#!/usr/bin/env python3
"""Write ``tests/kubeletplugin/fixtures/checkpoints/``: each checkpoint format as its own code wrote it.

The loader converts every format the plugin has ever written (``dra_driver/kubeletplugin/
checkpoint_formats.py``); its tests need those files as the old plugins left them, not as we
remember them. This script takes each writer's source from git (``git archive <commit>``), runs
its own ``Preparer`` in a subprocess on a simulated two-GPU node with the same three claims, and
copies the checkpoint it wrote:

* ``v1-8b268a3.json``: version 1 with the CDI spec inside each entry (8b268a3 .. c043a7b^). Claim
  ``c`` is ``PrepareStarted``: the process was killed at that code's ``after-prepare-started``
  failpoint, between its two writes;
* ``v1-28f86d3.json``: version 1 without specs (c043a7b .. 28f86d3, the last version-1 writer).
  Claim ``c`` is ``PrepareStarted`` the way that code writes one: its checkpoint was corrupt, its
  CDI spec was gone, and the start-up rebuilt its entry from the claim record;
* ``record-28f86d3.json``: that code's claim record (``prepared/<uid>.json``) of claim ``a``
  (records exist since b0c1868 and have had one layout).

Run from the repository root: ``.venv/bin/python hack/checkpoint_fixtures.py``. The files are
deterministic: the boot ID, UIDs, GPUs and the work directory are fixed below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "kubeletplugin" / "fixtures" / "checkpoints"

#: One program per writer: the Preparer's constructor and failpoints changed between them.
COMMON = r"""
import json, os, sys
from pathlib import Path
from dra_driver.kubeletplugin.checkpoint import Checkpoint
from dra_driver.kubeletplugin.claims import ClaimRef
from dra_driver.kubeletplugin.hamicore import HamiCoreConfig
from dra_driver.kubeletplugin.inventory import Inventory, NodeGpu
from dra_driver.kubeletplugin.prepare import Preparer, PreparerConfig

WORK = Path(sys.argv[1])
DRIVER, POOL, BOOT = "gpu.hami.io", "node-1", "3f6c1f0e-0d5b-4d3e-9a43-6b1f4c2d7e10"
GIB = 1 << 30
CLAIMS = {
    "a": ("0b5d3c52-6f4e-4a8e-9d1c-2e7f8a9b0c1d", [
        {"request": "gpu", "driver": DRIVER, "pool": POOL, "device": "gpu-0",
         "shareID": "6c1e2d3f-4a5b-4c6d-8e7f-901a2b3c4d5e",
         "consumedCapacity": {"memory": "4Gi", "cores": "25", "slots": "1"}}]),
    "b": ("1c6e4d63-7a5f-4b9f-8e2d-3f8a9b0c1d2e", [
        {"request": "whole", "driver": DRIVER, "pool": POOL, "device": "gpu-1"}]),
    "c": ("2d7f5e74-8b6a-4cad-9f3e-4a9b0c1d2e3f", [
        {"request": "gpu/small", "driver": DRIVER, "pool": POOL, "device": "gpu-0",
         "shareID": "7d2f3e4a-5b6c-4d7e-9f8a-0b1c2d3e4f5a",
         "consumedCapacity": {"memory": "2Gi", "cores": "10", "slots": "1"}}]),
}


def claim(name):
    uid, results = CLAIMS[name]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "pod-" + name,
                             "uid": "9e8d7c6b-5a49-4837-a261-" + uid[-12:]}],
        },
    }


class Claims:
    def get(self, ref):
        return next(claim(n) for n, (uid, _) in CLAIMS.items() if uid == ref.uid)

    def exists(self, namespace, name, uid):
        return True

    def list_all(self):
        return [claim(n) for n in CLAIMS]


def ref(name):
    return ClaimRef("team-a", name, CLAIMS[name][0])


inventory = Inventory([
    NodeGpu("gpu-0", 0, 0, "GPU-5e0c7a4b-1d2e-4f3a-8b9c-0d1e2f3a4b5c", "0000:3b:00.0", 16 * GIB),
    NodeGpu("gpu-1", 1, 1, "GPU-6f1d8b5c-2e3f-4a4b-9cad-1e2f3a4b5c6d", "0000:86:00.0", 16 * GIB),
])
(WORK / "cdi").mkdir(exist_ok=True)
config = PreparerConfig(driver=DRIVER, pool=POOL, cdi_dir=WORK / "cdi",
                        hami=HamiCoreConfig(WORK / "hami"), simulated=True, boot_id=BOOT)


def preparer():
    p = Preparer(config, inventory, Claims(), Checkpoint(WORK / "checkpoint.json"))
    p.start()
    return p


def prepare(p, *names):
    results = p.prepare([ref(n) for n in names])
    errors = {uid: r.error for uid, r in results.items() if r.error}
    assert not errors, errors
"""

#: 8b268a3: two writes per claim (PrepareStarted with the spec, then PrepareCompleted).
WRITER_8B268A3 = (
    COMMON
    + r"""
step = sys.argv[2]
p = preparer()
if step == "prepare":
    prepare(p, "a", "b")
else:  # killed by the after-prepare-started failpoint: c stays PrepareStarted on disk
    os.environ["HAMI_DRA_FAILPOINT"] = "after-prepare-started"
    prepare(p, "c")
"""
)

#: 28f86d3: one write per call; a PrepareStarted entry is what the rebuild from records writes
#: for a claim whose CDI spec is missing.
WRITER_28F86D3 = (
    COMMON
    + r"""
step = sys.argv[2]
if step == "prepare":
    prepare(preparer(), "a", "b", "c")
else:
    spec = next(s for s in (WORK / "cdi").iterdir() if CLAIMS["c"][0] in s.name)
    spec.unlink()
    (WORK / "checkpoint.json").write_text("{torn")
    preparer()  # quarantines the torn file, rebuilds from the records, saves
"""
)

#: Claim ``a``: its record is kept where the writer has records.
RECORD_UID = "0b5d3c52-6f4e-4a8e-9d1c-2e7f8a9b0c1d"

WRITERS = {
    "8b268a3": (WRITER_8B268A3, [("prepare", 0), ("kill", -9)]),
    "28f86d3": (WRITER_28F86D3, [("prepare", 0), ("rebuild", 0)]),
}


def write_fixture(commit: str, program: str, steps: list[tuple[str, int]]) -> Path:
    # A fixed directory: the 8b268a3 entries embed the HAMi-core host path in their specs.
    tmp = Path("/tmp") / f"hami-dra-checkpoint-{commit}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        source, work = tmp / "src", tmp / "work"
        source.mkdir(parents=True)
        work.mkdir()
        archive = subprocess.run(
            ["git", "archive", commit, "dra_driver"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        env = {**os.environ, "PYTHONPATH": str(source)}
        env.pop("HAMI_DRA_FAILPOINT", None)
        for step, want in steps:
            done = subprocess.run(
                [sys.executable, "-c", program, str(work), step],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
            )
            if done.returncode != want:
                raise SystemExit(f"{commit} {step}: exit {done.returncode}, want {want}\n{done.stderr}")
        target = OUT / f"v1-{commit}.json"
        raw = (work / "checkpoint.json").read_bytes()
        json.loads(raw)  # a whole file, or the writer is broken
        target.write_bytes(raw)
        record = work / "prepared" / f"{RECORD_UID}.json"
        if record.is_file():
            (OUT / f"record-{commit}.json").write_bytes(record.read_bytes())
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for commit, (program, steps) in WRITERS.items():
        print(write_fixture(commit, program, steps).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
