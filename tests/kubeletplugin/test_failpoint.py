"""The crash test hook kills the process for real, also as PID 1 of a container's PID namespace
(where a self-sent SIGKILL is dropped by the kernel), and does nothing when not armed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from dra_driver.kubeletplugin.failpoint import FAILPOINT_ENV, KILLED_STATUS

#: Stands in for the plugin: hits the failpoint, then says so if it is still alive.
SCRIPT = (
    "import os\n"
    "from dra_driver.kubeletplugin.failpoint import hit\n"
    "print('pid', os.getpid(), flush=True)\n"
    "hit('mig-after-create')\n"
    "print('survived', flush=True)\n"
)


def run(env_value: str | None, *, pid_namespace: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}
    if env_value is not None:
        env[FAILPOINT_ENV] = env_value
    command = [sys.executable, "-c", SCRIPT]
    if pid_namespace:
        unshare = shutil.which("unshare")
        if unshare is None:
            pytest.skip("unshare (util-linux) is needed for a PID namespace")
        probe = subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True, check=False)
        if probe.returncode != 0:
            pytest.skip(f"no PID namespace here: {probe.stderr.decode().strip()}")
        command = [unshare, "--pid", "--fork", "--kill-child", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=env)


@pytest.mark.parametrize("pid_namespace", [False, True], ids=["host-process", "pid-1-of-a-namespace"])
def test_an_armed_failpoint_kills_the_process(pid_namespace: bool) -> None:
    result = run("mig-after-create", pid_namespace=pid_namespace)
    if pid_namespace:
        assert result.stdout.startswith("pid 1\n"), result.stdout  # the container's case
    assert "survived" not in result.stdout, "the process went on past its failpoint"
    assert result.returncode in (-9, KILLED_STATUS), (result.returncode, result.stderr)


@pytest.mark.parametrize("armed", [None, "after-checkpoint"], ids=["unset", "another-failpoint"])
def test_a_failpoint_not_named_does_nothing(armed: str | None) -> None:
    result = run(armed, pid_namespace=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("survived\n")
