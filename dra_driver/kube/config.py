"""How every command gets its Kubernetes API client.

Components (controller, webhook, kubelet plugin) take ``--kubeconfig`` or run in-cluster:
:func:`load_api_client`. The read-only CLI tools (``top``, ``explain``, ``simulate
--from-cluster``), also run as ``kubectl hami-dra ...``, follow kubectl: :func:`load_kubectl_client`.

A client is built from its file without touching the process-wide default configuration, so two
components in one process (the demo, the tests) never share settings, and a kubeconfig is never
written back (refreshed tokens stay in memory).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.cli import UsageError

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: The context name reported for the pod's service account.
IN_CLUSTER = "in-cluster"
#: How a user fixes a missing or wrong kubeconfig, at the end of each such error.
HINT = "(pass --kubeconfig or set KUBECONFIG)"


def load_api_client(kubeconfig: str | None, *, connections: int | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``kubeconfig``, or for the pod's service account when None.

    ``connections``: how many connections to the API server are kept open for reuse (None: the
    client's default, 5 per CPU). A component that holds long-lived watches passes how many of
    its threads may each hold one at once: beyond the pool's size urllib3 still opens a
    connection for a request, but drops it afterwards, so every such request pays a new TCP and
    TLS handshake (and logs "Connection pool is full").
    """
    from kubernetes import client, config

    if not kubeconfig:
        configuration = _in_cluster()
        if connections is not None:
            configuration.connection_pool_maxsize = connections
        return client.ApiClient(pin_proxy(configuration))
    configuration = client.Configuration()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    try:
        api_client = config.new_client_from_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=kubeconfig, client_configuration=configuration
        )
    except (config.ConfigException, OSError) as err:
        raise UsageError(
            f"cannot load Kubernetes config from {kubeconfig}: {err} (pass --kubeconfig)"
        ) from None
    pin_proxy(api_client.configuration)
    return api_client


def pin_proxy(configuration: Any) -> Any:
    """Resolve the proxy from the environment once, for the host the configuration has now.

    The client re-reads every proxy variable (a walk over the whole of ``os.environ``) each time
    its host is assigned, and the kubeconfig and in-cluster token hooks assign it before every
    request: the biggest single cost of a claim read in the kubelet plugin's prepare, more in a
    pod whose environment holds a variable per Service. The connection pool is built from the
    proxy once anyway, so a proxy resolved again later could not take effect.
    """
    configuration.proxy = configuration.proxy
    return configuration


def _in_cluster() -> Any:
    """The ``kubernetes.client.Configuration`` of the pod's service account."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call,unused-ignore]
    except (config.ConfigException, OSError) as err:
        raise UsageError(
            f"cannot load Kubernetes config from in-cluster service account: {err} (pass --kubeconfig)"
        ) from None
    return configuration


def add_kubectl_flags(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--context``, read by :func:`load_kubectl_client`."""
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")


@dataclass(frozen=True, slots=True)
class KubectlClient:
    """An API client chosen as kubectl chooses one, and what it points at."""

    api_client: Any
    #: The kubeconfig context in use, or :data:`IN_CLUSTER`.
    context: str
    #: The context's namespace, else the service account's, else ``default``.
    namespace: str
    #: The API server's URL.
    server: str


def _any_file(paths: str) -> bool:
    """Whether any of the ``:``-separated files exists."""
    return any(Path(path).expanduser().is_file() for path in paths.split(os.pathsep) if path)


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig kubectl would read: ``--kubeconfig``, else ``$KUBECONFIG`` (files joined by
    ``:`` are merged), else ``~/.kube/config``; None: none, so the pod's service account.

    A ``$KUBECONFIG`` none of whose files exists counts as none inside a pod (kubectl's rule).
    Raises :class:`UsageError` for a missing file, unless it could only be the default.
    """
    if kubeconfig:
        if os.pathsep not in kubeconfig and not Path(kubeconfig).expanduser().is_file():
            raise UsageError(f"cannot load Kubernetes config: kubeconfig {kubeconfig} does not exist {HINT}")
        return kubeconfig
    variable = os.environ.get("KUBECONFIG")
    if variable:
        if _any_file(variable):
            return variable
        if "KUBERNETES_SERVICE_HOST" in os.environ:
            return None
        raise UsageError(
            f"cannot load Kubernetes config: kubeconfig {variable} ($KUBECONFIG) does not exist {HINT}"
        )
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def load_kubectl_client(kubeconfig: str | None, context: str | None) -> KubectlClient:
    """The client kubectl would use: the kubeconfig of :func:`kubeconfig_path` and its current context
    (``context`` picks another), else the pod's service account; errors are :class:`UsageError`.

    Requests are never retried: each retry would log a warning line before the one-line error.
    """
    from kubernetes import client, config

    path = kubeconfig_path(kubeconfig)
    if path is None:
        if context:
            raise UsageError(f"cannot load Kubernetes config: --context {context} needs a kubeconfig {HINT}")
        if "KUBERNETES_SERVICE_HOST" not in os.environ:
            raise UsageError(
                "cannot load Kubernetes config: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) "
                f"and not running in a pod {HINT}"
            )
        in_cluster = _in_cluster()
        in_cluster.retries = 0  # read when the client is made
        namespace = "default"
        if SERVICE_ACCOUNT_NAMESPACE.is_file():
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or namespace
        return KubectlClient(client.ApiClient(in_cluster), IN_CLUSTER, namespace, str(in_cluster.host))
    configuration = client.Configuration()
    try:
        contexts, current = config.list_kube_config_contexts(path)  # type: ignore[no-untyped-call,unused-ignore]
        chosen = current
        if context:
            chosen = next((c for c in contexts if c.get("name") == context), None)
            if chosen is None:
                names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
                raise UsageError(
                    f"cannot load Kubernetes config: context {context!r} not in {path} (contexts: {names})"
                )
        config.load_kube_config(  # type: ignore[no-untyped-call,unused-ignore]
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, OSError, ValueError) as err:
        raise UsageError(f"cannot load Kubernetes config from {path}: {err}") from None
    configuration.retries = 0  # read when the client is made
    chosen = chosen or {}
    namespace = str((chosen.get("context") or {}).get("namespace") or "default")
    return KubectlClient(
        client.ApiClient(configuration), str(chosen.get("name") or ""), namespace, str(configuration.host)
    )


#: (connect, read) seconds for the read-only CLI tools' requests: an unreachable server fails in
#: seconds, not minutes.
CLI_REQUEST_TIMEOUT = (10, 60)


def connection_reason(err: BaseException) -> str:
    """What went wrong reaching the server, without urllib3's connection reprs: ``Failed to
    establish a new connection: [Errno 111] Connection refused``."""
    reason = getattr(err, "reason", None) or err
    # urllib3 prefixes the connection's repr ("HTTPSConnection(host=...): Failed to ..."); drop it.
    return str(reason).split("): ", 1)[-1]


def unreachable(server: str, err: BaseException) -> UsageError:
    """The one line every CLI command prints when the API server cannot be reached (exit status 2)."""
    return UsageError(f"cannot reach the API server at {server}: {connection_reason(err)}")


def is_connection_error(err: BaseException) -> bool:
    """Whether ``err`` is a failure to reach or talk to the server (not an API error status)."""
    from urllib3.exceptions import HTTPError

    return isinstance(err, HTTPError | OSError)
