"""The driver's real admission webhook, served over HTTPS and registered with the sandbox.

The sandbox calls it the way kube-apiserver does (AdmissionReview v1, trusting only the
configuration's ``caBundle``), so every demo pod gets the ``gpu.hami.io/allocation`` gate from
the webhook itself and every DeviceClass/claim template is validated by it.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any

from dra_driver.webhook.lookup import KubeLookup
from dra_driver.webhook.server import WebhookServer, tls_context
from hami_dra_dev.certs import make_self_signed
from hami_dra_dev.demo import manifests
from hami_dra_dev.webhooks import MUTATING, webhook_configurations


class DemoWebhook:
    """Starts the webhook on 127.0.0.1 (free port) and registers its configurations."""

    def __init__(self, api_client: Any, driver: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hami-dra-demo-webhook-")
        self._api_client = api_client
        self.driver = driver
        try:
            pair = make_self_signed(Path(self._dir.name), "hami-dra-webhook", ("127.0.0.1", "localhost"))
            self.ca_bundle = base64.b64encode(pair.ca_pem).decode()
            self.server = WebhookServer(
                KubeLookup(api_client, driver),
                driver,
                host="127.0.0.1",
                port=0,
                ssl_context=tls_context(str(pair.cert_file), str(pair.key_file)),
            )
            self.server.start()
        except BaseException:
            api_client.close()
            self._dir.cleanup()
            raise

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    def register(self) -> list[str]:
        """Create the Mutating/ValidatingWebhookConfiguration objects; returns their kinds."""
        from kubernetes import client

        api: Any = client.AdmissionregistrationV1Api(self._api_client)
        kinds = []
        configurations = webhook_configurations(
            self.url, self.ca_bundle, manifests.DRIVER, name="hami-dra-demo", timeout_seconds=5
        )
        for kind, body in configurations:
            if kind == MUTATING:
                api.create_mutating_webhook_configuration(body, _preload_content=False)
            else:
                api.create_validating_webhook_configuration(body, _preload_content=False)
            kinds.append(kind)
        return kinds

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            self._api_client.close()
            self._dir.cleanup()
