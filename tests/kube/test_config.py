"""``load_kubectl_client``: the kubeconfig and context kubectl would pick, else the service account.

No API server is needed: a client is built, never used. The CLI tests (tests/top/test_command.py,
tests/simulate/test_from_cluster.py on the real API server tier, tests/docs on the demo's) run the
same function against a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import UsageError
from dra_driver.kube import config
from dra_driver.kube.config import IN_CLUSTER, load_kubectl_client


def kubeconfig(path: Path, *contexts: tuple[str, str, str | None], current: str | None = None) -> Path:
    """A kubeconfig of ``contexts`` (name, server, namespace), each with its own cluster and user."""
    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}} for name, server, _ in contexts],
        "users": [{"name": name, "user": {"token": f"token-{name}"}} for name, _, _ in contexts],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, **({"namespace": ns} if ns else {})}}
            for name, _, ns in contexts
        ],
    }
    if current is not None:
        data["current-context"] = current
    path.write_text(yaml.safe_dump(data))
    return path


def retries(api_client: Any) -> object:
    """How often the client's connection pools retry (fixed when the client is made)."""
    return api_client.rest_client.pool_manager.connection_pool_kw["retries"].total


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $KUBECONFIG, an empty home and not in a pod, unless a test says otherwise."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    return home


def test_the_current_context_of_the_given_file_with_its_namespace(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        ("lab", "https://lab:6443", "team-a"),
        ("prod", "https://prod:6443", None),
        current="lab",
    )
    chosen = load_kubectl_client(str(path), None)
    assert (chosen.context, chosen.namespace, chosen.server) == ("lab", "team-a", "https://lab:6443")
    assert retries(chosen.api_client) == 0, "a retry would log a line before the error"
    other = load_kubectl_client(str(path), "prod")
    assert (other.context, other.namespace, other.server) == ("prod", "default", "https://prod:6443")


def test_kubeconfig_then_its_files_merged_then_the_home_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nowhere: Path
) -> None:
    (nowhere / ".kube").mkdir()
    kubeconfig(nowhere / ".kube" / "config", ("home", "https://home:6443", None), current="home")
    assert load_kubectl_client(None, None).context == "home"
    first = kubeconfig(tmp_path / "a", ("a", "https://a:6443", None), current="a")
    second = kubeconfig(tmp_path / "b", ("b", "https://b:6443", "ns-b"))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{first}:{second}")
    assert load_kubectl_client(None, None).server == "https://a:6443"
    assert load_kubectl_client(None, "b").namespace == "ns-b"
    explicit = kubeconfig(tmp_path / "c", ("c", "https://c:6443", None), current="c")
    assert load_kubectl_client(str(explicit), None).context == "c"


@pytest.mark.parametrize(
    ("kubeconfig_flag", "variable", "context", "message"),
    [
        (
            "{tmp}/missing",
            None,
            None,
            "cannot load Kubernetes config: kubeconfig {tmp}/missing does not exist",
        ),
        (None, "{tmp}/gone", None, "kubeconfig {tmp}/gone ($KUBECONFIG) does not exist"),
        (
            None,
            None,
            None,
            "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a pod",
        ),
        (None, None, "prod", "--context prod needs a kubeconfig"),
        ("{tmp}/config", None, "nope", "context 'nope' not in {tmp}/config (contexts: lab)"),
        ("{tmp}/broken", None, None, "cannot load Kubernetes config from {tmp}/broken: "),
    ],
)
def test_errors_are_one_line_saying_what_to_do(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kubeconfig_flag: str | None,
    variable: str | None,
    context: str | None,
    message: str,
) -> None:
    kubeconfig(tmp_path / "config", ("lab", "https://lab:6443", None), current="lab")
    (tmp_path / "broken").write_text("apiVersion: v1\nkind: Config\n")  # no current-context
    if variable:
        monkeypatch.setenv("KUBECONFIG", variable.format(tmp=tmp_path))
    with pytest.raises(UsageError) as err:
        load_kubectl_client(kubeconfig_flag.format(tmp=tmp_path) if kubeconfig_flag else None, context)
    text = str(err.value)
    assert message.format(tmp=tmp_path) in text and "\n" not in text
    if kubeconfig_flag is None or "missing" in kubeconfig_flag:
        assert text.endswith("(pass --kubeconfig or set KUBECONFIG)")


def test_in_a_pod_the_service_account_and_its_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    token, cert, namespace = tmp_path / "token", tmp_path / "ca.crt", tmp_path / "namespace"
    token.write_text("t")
    cert.write_text("not read until a request is made")
    namespace.write_text("team-a\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(cert))
    monkeypatch.setattr(config, "SERVICE_ACCOUNT_NAMESPACE", namespace)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    # A $KUBECONFIG whose files do not exist counts as none inside a pod, as for kubectl.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    chosen = load_kubectl_client(None, None)
    assert (chosen.context, chosen.namespace, chosen.server) == (IN_CLUSTER, "team-a", "https://10.0.0.1:443")
    assert retries(chosen.api_client) == 0
    namespace.unlink()
    assert load_kubectl_client(None, None).namespace == "default"
    with pytest.raises(UsageError, match="--context lab needs a kubeconfig"):
        load_kubectl_client(None, "lab")


def test_a_component_sizes_its_connection_pool_for_its_threads(tmp_path: Path) -> None:
    """``connections`` is how many connections to the API server stay open for reuse; without it
    the client keeps its default (5 per CPU)."""
    path = kubeconfig(tmp_path / "config", ("lab", "https://lab:6443", None), current="lab")
    sized = config.load_api_client(str(path), connections=14)
    assert sized.rest_client.pool_manager.connection_pool_kw["maxsize"] == 14
    assert sized.configuration.host == "https://lab:6443"
    default = config.load_api_client(str(path))
    assert (
        default.rest_client.pool_manager.connection_pool_kw["maxsize"]
        == default.configuration.connection_pool_maxsize
    )


def test_a_component_resolves_its_proxy_from_the_environment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubeconfig's token hook assigns the host before every request; the client would walk
    the environment for proxies each time. The proxy is resolved at load, and still honoured."""
    from kubernetes.client import configuration as client_configuration

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.lab:3128")
    path = kubeconfig(tmp_path / "config", ("lab", "https://lab:6443", None), current="lab")
    api_client = config.load_api_client(str(path))
    assert api_client.configuration.proxy == "http://proxy.lab:3128"
    reads: list[int] = []
    real = client_configuration.getproxies

    def counted() -> dict[str, str]:
        reads.append(1)
        return real()

    monkeypatch.setattr(client_configuration, "getproxies", counted)
    api_client.configuration.refresh_api_key_hook(api_client.configuration)  # what each request runs
    assert reads == [] and api_client.configuration.host == "https://lab:6443"
    assert api_client.configuration.proxy == "http://proxy.lab:3128"
