"""``hami-dra cluster up --no-driver`` as a child process, for the real-cluster tests and benchmarks.

The cluster runs exactly as a user starts it (its own process, the default state directory unless
told otherwise) and is stopped with SIGTERM, which is what ``hami-dra cluster down`` sends.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dra_driver.cli import CHILD_ENTRY


class ClusterStartFailed(RuntimeError):
    """``cluster up`` exited or did not print its kubeconfig in time; the message holds its output."""


class ClusterChild:
    def __init__(self, state_dir: Path, kubernetes_version: str | None = None, *, supervise: bool = True):
        command = [sys.executable, "-c", CHILD_ENTRY, "cluster", "up", "--no-driver", "--no-build"]
        command += ["--state-dir", str(state_dir)]
        if supervise:
            command.append("--supervise")
        if kubernetes_version:
            command += ["--kubernetes-version", kubernetes_version]
        self.command = command
        self.state_dir = state_dir
        self.output: list[str] = []
        self._kubeconfig: list[Path] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 240.0) -> Path:
        """Start the cluster; returns its admin kubeconfig once ``cluster up`` reports it."""
        process = self._process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._kubeconfig and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not self._kubeconfig:
            self.stop()
            tail = "\n".join(self.output[-30:])
            raise ClusterStartFailed(f"hami-dra cluster up did not come up within {timeout:.0f}s:\n{tail}")
        return self._kubeconfig[0]

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.output.append(line.rstrip())
            if line.startswith("kubeconfig: "):
                self._kubeconfig.append(Path(line.split(": ", 1)[1].strip()))

    def stop(self, timeout: float = 120.0) -> None:
        process = self._process
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        self._process = None
