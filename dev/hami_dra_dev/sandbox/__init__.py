"""A sandbox Kubernetes cluster in one process, for tests and the demo. Never used in production.

No kube-apiserver, kubelet or GPU can be installed on the development machines, so the driver's
components are tested against this strict stand-in: a real HTTPS API server speaking the
Kubernetes REST protocol, and a node simulator playing the parts of kube-controller-manager,
kube-scheduler and kubelet that DRA relies on. Whatever it accepts, a real API server must
accept too; where it is simpler than Kubernetes it says so below.

Modules: ``server`` (:class:`SandboxServer`, start/stop, kubeconfig), ``http`` (REST routing,
lists, watches), ``api`` (write path: admission, validation, optimistic concurrency, finalizers,
garbage collection), ``store`` (global resourceVersion, history, watchers), ``validation``
(kubernetes-validate strict, metadata; ``dra_rules``, ``pod_rules``, ``event_rules``, ``fieldcheck``),
``admission`` (webhooks), ``patch``, ``selectors``,
``tables``, ``discovery``, ``faults``, ``certs``; simulator: ``cluster`` (:class:`SandboxCluster`,
nodes, per-node kubelet hook), ``claimcontroller``, ``scheduler``, ``firstfit``, ``events``,
``reconciler``, ``kubelet``;
``driver`` and ``command`` for ``hami-dra sandbox up|status|down``.

Known simplifications (all stricter or absent, never more permissive):

- JSON responses only (clients asking for protobuf or CBOR also accept JSON); protobuf request
  bodies are decoded for Namespace only (``kubectl create namespace``, see ``protobuf``), others
  get 415 naming the kind; no server-side apply (``kubectl apply --server-side`` gets 415;
  client-side ``kubectl apply`` works); ``/openapi/v3`` only says which PATCH operations exist and
  that ``fieldValidation`` is supported (no schemas, so no ``kubectl explain``); ``/openapi/v2`` is
  a document without definitions (kubectl then leaves a ``kind: List``'s items to the server's
  strict validation).
- Only the resources the driver uses are served; any other (ConfigMaps, Deployments, ...) gets a
  404 that names it and points at ``hami-dra cluster up`` (a real API server).
- Unknown fields are always rejected (as ``fieldValidation=Strict``), also for clients that
  default to ``Warn``.
- Pods are deleted at once (no graceful termination; finalizers are honoured); namespaces are
  drained and removed by a background task.
- Webhooks: ``matchConditions``, reinvocation and ``matchPolicy`` are not evaluated; ``service``
  client configs need ``server.api.admission.service_resolver`` (the certificate is still checked
  for ``<name>.<namespace>.svc``, as kube-apiserver does).
- Lists are served from the current state (``resourceVersionMatch`` is accepted, not enforced);
  ``continue`` tokens page through the current state.
- No authorization: the one bearer token in the kubeconfig may do everything.
"""

from typing import Any

__all__ = ["SandboxServer"]


def __getattr__(name: str) -> Any:
    """Import the server on first use, so that ``hami-dra --help`` works without the sandbox extra."""
    if name == "SandboxServer":
        from hami_dra_dev.sandbox.server import SandboxServer

        return SandboxServer
    raise AttributeError(name)
