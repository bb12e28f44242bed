"""Warning events on this plugin's Node, so ``kubectl describe node`` says why GPUs are missing.

Best effort: an event the API refuses (RBAC, a quota on events) is logged and dropped; the same
message is never posted twice in a row, and one event per reason is updated (``count``) rather
than a new one created, as kubelet does for repeated node problems.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import Any

LOG = logging.getLogger(__name__)

COMPONENT = "hami-dra-kubelet-plugin"


class NodeEvents:
    """Posts one Warning event per (reason, message) on the Node named ``node_name``."""

    def __init__(self, api_client: Any, node_name: str, driver_name: str) -> None:
        from kubernetes import client

        self._core: Any = client.CoreV1Api(api_client)
        self._exception = client.exceptions.ApiException
        self.node_name = node_name
        self.driver_name = driver_name
        self._posted: dict[str, str] = {}

    def warn(self, reason: str, message: str, node_uid: str | None) -> None:
        if self._posted.get(reason) == message:
            return
        self._posted[reason] = message
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        digest = hashlib.sha256(f"{self.driver_name}/{reason}/{message}".encode()).hexdigest()[:10]
        body = {
            "metadata": {"name": f"{self.node_name}.{reason.lower()}.{digest}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": self.node_name, "uid": node_uid or self.node_name},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": f"{self.driver_name}/kubelet-plugin",
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._core.create_namespaced_event("default", body)
        except self._exception as err:
            if err.status == 409:
                return  # posted by an earlier run of the plugin: kubectl shows that one
            LOG.info("could not post the %s event on node %s: %s", reason, self.node_name, err.status)
        except Exception as err:  # events are best effort; the log line is the record
            LOG.info("could not post the %s event on node %s: %s", reason, self.node_name, err)

    def clear(self, reason: str) -> None:
        """Forget ``reason`` so that it is posted again if it comes back."""
        self._posted.pop(reason, None)
