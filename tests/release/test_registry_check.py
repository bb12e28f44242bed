"""Before anything is built, ``make release`` checks REGISTRY and that it answers: a bad value, a
closed port and an untrusted certificate each end in one line that says what to do."""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.release import main, registry
from hack.release.errors import ReleaseError
from hami_dra_dev.certs import CertPair, make_self_signed


class _V2(http.server.BaseHTTPRequestHandler):
    """A registry's ``/v2/`` asking for a login, as ghcr.io does."""

    def do_GET(self) -> None:
        self.send_response(401 if self.path == "/v2/" else 404)
        self.send_header("WWW-Authenticate", 'Bearer realm="https://auth.invalid/token"')
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> CertPair:
    return make_self_signed(tmp_path_factory.mktemp("tls"), "registry", hosts=("127.0.0.1",))


@pytest.fixture(scope="module")
def tls_registry(tls: CertPair) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _V2)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_registry_asking_for_a_login_is_reachable(tls_registry: str, tls: CertPair) -> None:
    registry.check_reachable(registry.Target(f"{tls_registry}/team", ca_file=tls.cert_file))


def test_an_untrusted_certificate_asks_for_the_ca(tls_registry: str) -> None:
    with pytest.raises(ReleaseError, match=r"TLS certificate is not trusted .*: pass CA_FILE="):
        registry.check_reachable(registry.Target(tls_registry))


def test_plain_http_against_a_closed_port_says_what_to_do() -> None:
    port = _closed_port()
    with pytest.raises(ReleaseError) as raised:
        registry.check_reachable(registry.Target(f"127.0.0.1:{port}", plain_http=True), timeout=5)
    message = str(raised.value)
    assert message.startswith(f"registry 127.0.0.1:{port} is unreachable at http://127.0.0.1:{port}/v2/")
    assert message.endswith("make release PUSH=0")


@pytest.mark.parametrize("bad", ["https://ghcr.io/x", "ghcr.io/x/", "", "/x"])
def test_a_registry_that_is_not_host_port_path_is_refused(bad: str) -> None:
    with pytest.raises(ReleaseError, match=r"is not host\[:port\]\[/path\]"):
        registry.Target(bad)


def test_a_missing_ca_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match=r"CA_FILE=.* does not exist"):
        registry.Target("ghcr.io/x", ca_file=tmp_path / "ca.crt")


def test_the_command_fails_in_one_line_before_building_anything(tmp_path: Path) -> None:
    port = _closed_port()
    done = subprocess.run(
        [sys.executable, "-m", "hack.release", "--registry", f"127.0.0.1:{port}/x", "--out", str(tmp_path)],
        cwd=main.REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "warning" not in line]
    assert len(errors) == 1 and errors[0].startswith("release: error: registry 127.0.0.1:"), done.stderr
    assert not any(tmp_path.iterdir()), "nothing was built"
