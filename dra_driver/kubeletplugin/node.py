"""This node's Node object, read once for every part of the kubelet plugin that needs it.

The withheld-GPU check reads the Node every ``recheck_seconds`` (its allocatable shows NVIDIA's
device plugin); the slice publisher needs its UID (the slices' owner reference). Both go through
one :class:`NodeReader`, which keeps the UID of the last Node read: the publisher reads the Node
itself only when nothing has read it yet (a simulated node, or ``--allow-device-plugin``).
"""

from __future__ import annotations

from dra_driver.kube.api import NODES, KubeApi, Obj
from dra_driver.kube.errors import KubeError


class NodeReader:
    """Reads the Node ``name`` and remembers its UID."""

    def __init__(self, kube: KubeApi, name: str) -> None:
        self.kube = kube
        self.name = name
        self._uid: str | None = None

    def read(self) -> Obj:
        """The Node as the API holds it now; raises :class:`KubeError` when it cannot be read."""
        node = self.kube.get(NODES, None, self.name)
        uid = (node.get("metadata") or {}).get("uid")
        if uid:
            self._uid = str(uid)
        return node

    def uid(self) -> str | None:
        """The Node's UID from the last read, else read now; None while the Node does not exist."""
        if self._uid is None:
            try:
                self.read()
            except KubeError as err:
                if not err.not_found:
                    raise
        return self._uid
