"""One way for every component to get a Kubernetes API client: ``--kubeconfig`` or in-cluster.

The client is built from the given file without touching the process-wide default
configuration, so two components in one process (the demo, the tests) never share settings.
"""

from __future__ import annotations

from typing import Any

from dra_driver.cli import UsageError


def load_api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``kubeconfig``, or for the pod's service account when None."""
    from kubernetes import client, config

    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call,unused-ignore]
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call,unused-ignore]
        return client.ApiClient(configuration)
    except (config.ConfigException, OSError) as err:
        where = kubeconfig or "in-cluster service account"
        raise UsageError(f"cannot load Kubernetes config from {where}: {err} (pass --kubeconfig)") from None
