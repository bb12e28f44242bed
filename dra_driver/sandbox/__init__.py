"""A sandbox Kubernetes cluster in one process, for tests and the demo. Never used in production.

No kube-apiserver, kubelet or GPU can be installed on the development machines, so the driver's
components are tested against this strict stand-in: a real HTTP API server speaking the
Kubernetes REST protocol (``server``/``http``/``api``), and a node simulator playing the parts of
kube-controller-manager, kube-scheduler and kubelet that DRA relies on (``nodes``). Whatever it
accepts, a real API server must accept too; where it is simpler than Kubernetes it says so.

Entry points: :class:`~dra_driver.sandbox.server.SandboxServer` (fixtures) and
``hami-dra sandbox up|down`` (``command``). No production module imports this package.
"""

from dra_driver.sandbox.server import SandboxServer

__all__ = ["SandboxServer"]
