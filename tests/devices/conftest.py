"""Fixtures for GPU discovery tests: the mock NVML library and a runner for NVML in a subprocess.

``libnvidia-ml.so.1`` is found by ``dlopen`` through ``LD_LIBRARY_PATH``, which the loader reads
once at process start, and pynvml keeps the library loaded for the life of the process; so every
NVML run happens in a fresh Python subprocess with the mock's directory on ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
if str(TESTS) not in sys.path:  # makes tests/kube_validate.py importable as `kube_validate`
    # Appended, not prepended: tests/resource/ must not shadow the standard library's `resource`
    # (prometheus_client imports it), nor any other test folder an installed module.
    sys.path.append(str(TESTS))

MOCK_SOURCE = REPO / "hack" / "mock-nvml" / "mock_nvml.c"

from mock_profiles import fake_sysfs, nvml_env  # noqa: E402  (needs the path above)

from dra_driver.devices.mig import MigDevice  # noqa: E402
from dra_driver.devices.model import Gpu  # noqa: E402


@pytest.fixture(scope="session")
def mock_nvml(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build the mock twice: current driver and a legacy one lacking newer calls. Returns lib dirs."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build hack/mock-nvml; run `bash hack/install.d/gcc.sh`")
    dirs = {}
    for variant, flags in (("current", []), ("legacy", ["-DMOCK_NVML_LEGACY"])):
        out = tmp_path_factory.mktemp(f"mock-nvml-{variant}")
        subprocess.run(
            [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-soname,libnvidia-ml.so.1", *flags,
             "-o", str(out / "libnvidia-ml.so.1"), str(MOCK_SOURCE)],
            check=True,
        )  # fmt: skip
        dirs[variant] = out
    return dirs


_DISCOVER_SNIPPET = """
import dataclasses, json, logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from dra_driver.devices.nvml import NvmlSource
from dra_driver.devices.source import DeviceSourceError
source = NvmlSource(sysfs_root=Path(sys.argv[1]))
try:
    runs = [source.discover() for _ in range(int(sys.argv[2]))]
except DeviceSourceError as err:
    print(json.dumps({"error": str(err)}))
    sys.exit(0)
print(json.dumps({"gpus": [dataclasses.asdict(gpu) for gpu in runs[-1]]}))
"""


class NvmlRun:
    """Result of one NVML discovery in a subprocess."""

    def __init__(self, payload: dict[str, Any], stderr: str) -> None:
        self.error: str | None = payload.get("error")
        self.gpus = [_gpu_from_dict(item) for item in payload.get("gpus", [])]
        self.stderr = stderr


def _gpu_from_dict(item: dict[str, Any]) -> Gpu:
    item = dict(item)
    item["nvlink_peers"] = tuple(tuple(pair) for pair in item["nvlink_peers"])
    item["mig_devices"] = tuple(MigDevice(**mig) for mig in item.get("mig_devices", ()))
    return Gpu(**item)


@pytest.fixture
def run_nvml(mock_nvml: dict[str, Path], tmp_path: Path) -> Callable[..., NvmlRun]:
    """``run_nvml(profile, legacy=False, sysfs=None, repeat=1)`` -> NvmlRun (GPUs or the error)."""

    def run(
        profile: dict[str, Any],
        *,
        legacy: bool = False,
        sysfs: Sequence[Gpu] | Path | None = None,
        repeat: int = 1,
    ) -> NvmlRun:
        profile_path = tmp_path / "profile.json"
        profile_path.write_text(json.dumps(profile))
        sysfs_root = sysfs if isinstance(sysfs, Path) else fake_sysfs(tmp_path / "sys", sysfs or [])
        proc = subprocess.run(
            [sys.executable, "-c", _DISCOVER_SNIPPET, str(sysfs_root), str(repeat)],
            env=nvml_env(mock_nvml["legacy" if legacy else "current"], profile_path),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return NvmlRun(json.loads(proc.stdout), proc.stderr)

    return run


@pytest.fixture
def run_nvml_script(
    mock_nvml: dict[str, Path], tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_nvml_script(code, profile, *args, events=None, legacy=False, mig_state=None)``:
    ``python -c code args`` against the mock answering ``profile``; ``events`` (lines, see
    hack/mock-nvml/mock_nvml.c) are written to the file the mock's ``nvmlEventSetWait`` reads;
    ``mig_state`` is the file MIG instances outlive the process in. Fails the test if the script
    fails.
    """

    def run(
        code: str,
        profile: dict[str, Any],
        *args: str,
        events: str | None = None,
        legacy: bool = False,
        mig_state: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        profile_path = tmp_path / "script-profile.json"
        profile_path.write_text(json.dumps(profile))
        events_path = None
        if events is not None:
            events_path = tmp_path / "events"
            events_path.write_text(events)
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            env=nvml_env(mock_nvml["legacy" if legacy else "current"], profile_path, events_path, mig_state),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    return run
