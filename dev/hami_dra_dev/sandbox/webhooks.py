"""Our webhook configurations (hami_dra_dev/webhooks.py) written into the sandbox's in-process API."""

from __future__ import annotations

from typing import Any

from hami_dra_dev.webhooks import MUTATING, VALIDATING, webhook_configurations


def register_webhooks(api: Any, base_url: str, ca_bundle: str, driver_name: str, **kwargs: Any) -> None:
    """Create both configurations directly in the sandbox's in-process API (``SandboxServer.api``)."""
    from hami_dra_dev.sandbox.resources import require

    plural = {MUTATING: "mutatingwebhookconfigurations", VALIDATING: "validatingwebhookconfigurations"}
    for kind, body in webhook_configurations(base_url, ca_bundle, driver_name, **kwargs):
        api.create(require("admissionregistration.k8s.io", "v1", plural[kind]), "", body)
