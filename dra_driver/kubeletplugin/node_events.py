"""Warning events on this plugin's Node, so ``kubectl describe node`` says why GPUs are missing.

Written through the ``events.k8s.io/v1`` recorder (dra_driver/kube/events.py): best effort (an
event the API refuses, by RBAC or a quota on events, is logged and dropped), and a problem that
comes back after it was cleared counts on the same Event's series rather than adding another. The
same message is never posted twice in a row.
"""

from __future__ import annotations

import logging

from dra_driver.kube.api import NODES, KubeApi
from dra_driver.kube.errors import KubeError
from dra_driver.kube.events import WARNING, EventRecorder

LOG = logging.getLogger(__name__)

#: The event's ``action``: what the plugin was doing when it met the problem.
ACTION = "PublishDevices"


def reporting_controller(driver_name: str) -> str:
    """The events' ``reportingController`` (a qualified name: ``gpu.hami.io/kubelet-plugin``)."""
    return f"{driver_name}/kubelet-plugin"


class NodeEvents:
    """Posts one Warning event per (reason, message) on the Node named ``node_name``."""

    def __init__(self, kube: KubeApi, node_name: str, driver_name: str) -> None:
        self.kube = kube
        self.node_name = node_name
        self.driver_name = driver_name
        self.recorder = EventRecorder(kube, controller=reporting_controller(driver_name), instance=node_name)
        self._posted: dict[str, str] = {}
        self._node_uid: str | None = None

    def warn(self, reason: str, message: str, node_uid: str | None) -> None:
        if self._posted.get(reason) == message:
            return
        self._posted[reason] = message
        uid = node_uid or self._uid()
        meta = {"name": self.node_name}
        if uid:  # kubectl describe node finds the node's events by uid too
            meta["uid"] = uid
        node = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
        self.recorder.emit(node, WARNING, reason, ACTION, message)

    def clear(self, reason: str) -> None:
        """Forget ``reason`` so that it is posted again if it comes back."""
        self._posted.pop(reason, None)

    def _uid(self) -> str | None:
        if self._node_uid is None:
            try:
                self._node_uid = str(self.kube.get(NODES, None, self.node_name)["metadata"]["uid"])
            except (KubeError, KeyError) as err:
                LOG.info(
                    "node %s not read for its events (%s): they name it without its uid", self.node_name, err
                )
        return self._node_uid
