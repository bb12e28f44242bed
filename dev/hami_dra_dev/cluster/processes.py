"""Host processes of the cluster: started with a log file each, probed for readiness, stopped.

Every child gets ``PR_SET_PDEATHSIG`` = SIGKILL, so a ``cluster up`` that is itself killed takes
its components with it instead of leaving them behind; containerd's shims, which re-parent
themselves, are removed by :mod:`hami_dra_dev.cluster.cleanup`.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ComponentFailed(RuntimeError):
    """A component exited or did not become ready; the message names its log file."""


@dataclass(frozen=True)
class Probe:
    """An HTTP(S) GET that must answer 200 (``client`` cert/key optional, server not verified)."""

    url: str
    client_cert: str | None = None
    client_key: str | None = None

    def ok(self) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if self.client_cert and self.client_key:
            context.load_cert_chain(self.client_cert, self.client_key)
        try:
            with urllib.request.urlopen(self.url, timeout=2, context=context) as response:
                return int(response.status) == 200
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def as_dict(self) -> dict[str, str | None]:
        return {"url": self.url, "client_cert": self.client_cert, "client_key": self.client_key}


class HostProcess:
    def __init__(
        self,
        name: str,
        args: list[str],
        log_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        probe: Probe | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.args = args
        self.env = dict(env) if env is not None else None
        self.log_path = log_dir / f"{name}.log"
        self.probe = probe
        self._ready = ready
        self.restarts = 0
        self._log = self.log_path.open("ab")
        log.info("starting %s: %s", name, " ".join(args))
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                self.args,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=_die_with_parent,
            )
        except OSError as err:
            self._log.close()
            raise ComponentFailed(f"cannot start {self.name} ({self.args[0]}): {err}") from err

    def restart(self) -> None:
        """Start the same command again after it exited, as a node's supervisor (systemd) would."""
        if self.alive():
            return
        self.restarts += 1
        if self._log.closed:
            self._log = self.log_path.open("ab")
        log.warning("%s exited with status %s; restarting it", self.name, self.process.returncode)
        self.process = self._spawn()

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        if not self.alive():
            return False
        if self._ready is not None:
            return self._ready()
        return self.probe.ok() if self.probe is not None else True

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ComponentFailed(
                    f"{self.name} exited with status {self.process.returncode}; see {self.log_path}"
                    f"\n{tail(self.log_path)}"
                )
            if self.ready():
                return
            time.sleep(0.2)
        raise ComponentFailed(
            f"{self.name} not ready within {timeout:.0f}s; see {self.log_path}\n{tail(self.log_path)}"
        )

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(f"  | {line}" for line in text[-lines:])
