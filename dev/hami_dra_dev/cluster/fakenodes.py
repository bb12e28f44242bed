"""Many simulated nodes on the real control plane, without a kubelet each (``make bench-cluster``).

Each node is a Node object that reports Ready, with a heartbeat Lease that ``FakeNodes`` renews,
and the ResourceSlice pool our kubelet plugin would publish for it: simulated GPUs of one profile,
built by the plugin's own ``build_resource_slices`` (NUMA/PCI attributes, consumable memory, cores
and slots, the policy taint), owned by the Node. kube-scheduler and our controller see them as
they see real nodes; pods bound to them never start (nothing runs them), which is all a
scheduling benchmark needs: a pod counts as placed once it is bound and its claims allocated.

Why leases: kube-controller-manager's node lifecycle controller marks a node whose status and
Lease both stop changing for ``--node-monitor-grace-period`` (50 s by default) NotReady and taints
it, and kube-scheduler then skips it. Renewing the Lease is the cheapest heartbeat (one small
PATCH per node per period), the same one a kubelet sends.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.simulated import profile_gpus
from dra_driver.resource.slice_builder import build_resource_slices

log = logging.getLogger(__name__)

#: Label on every simulated node (and the selector that lists or deletes them).
SIMULATED_LABEL = "gpu.hami.io/simulated-node"
LEASE_NAMESPACE = "kube-node-lease"
#: Well inside the node lifecycle controller's 50 s grace period, even on a busy 2-core machine.
RENEW_SECONDS = 10.0


@dataclass(frozen=True)
class FakeNodeSpec:
    count: int
    gpus: int = 8
    profile: str = "h100-80gb"
    prefix: str = "sim"
    driver_name: str = DEFAULT_DRIVER_NAME
    cpu: str = "128"
    memory: str = "1Ti"
    pods: str = "250"

    def names(self) -> list[str]:
        width = max(4, len(str(self.count - 1)))
        return [f"{self.prefix}-{index:0{width}d}" for index in range(self.count)]


def _now(micro: bool = True) -> str:
    """RFC 3339 UTC: Lease times carry microseconds, Node condition times whole seconds."""
    return datetime.datetime.now(datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    )


def node_body(name: str, spec: FakeNodeSpec) -> dict[str, Any]:
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    now = _now(micro=False)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", SIMULATED_LABEL: "true"},
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "SimulatedNodeReady",
                    "message": "simulated by hami-dra's benchmark (no kubelet)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


class FakeNodes:
    """Create, keep Ready and delete ``spec.count`` simulated nodes with their GPU slices."""

    def __init__(
        self,
        api_client: Any,
        spec: FakeNodeSpec,
        *,
        parallel: int = 8,
        names: Sequence[str] | None = None,
        publish: bool = True,
    ) -> None:
        """``names``: the nodes' names (default ``spec.names()``); ``publish``: create each node's
        GPU slices too (a test that publishes its own leaves them out)."""
        from kubernetes import client

        self.spec = spec
        self.names = list(names) if names is not None else spec.names()
        self._publish = publish
        self._core: Any = client.CoreV1Api(api_client)
        self._resource: Any = client.ResourceV1Api(api_client)
        self._coordination: Any = client.CoordinationV1Api(api_client)
        self._parallel = parallel
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def create(self) -> None:
        """Create every node, its status, its Lease and its slices; start renewing the Leases."""
        self._each(self._create_one, self.names)
        self._renewer = threading.Thread(target=self._renew_loop, name="fake-node-leases", daemon=True)
        self._renewer.start()
        log.info(
            "%d simulated nodes with %d %s GPUs each", len(self.names), self.spec.gpus, self.spec.profile
        )

    def _create_one(self, name: str) -> None:
        body = node_body(name, self.spec)
        created = self._core.create_node(body)
        # Status is a subresource: what create was given may be reset, so write it explicitly (a
        # patch: kube-controller-manager may already have updated the node, e.g. its pod CIDR).
        self._core.patch_node_status(name, {"status": body["status"]})
        self._coordination.create_namespaced_lease(
            LEASE_NAMESPACE,
            {
                "metadata": {"name": name},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _now()},
            },
        )
        if not self._publish:
            return
        gpus = profile_gpus(self.spec.profile, node_name=name, gpus=self.spec.gpus)
        for slice_ in build_resource_slices(
            gpus, driver_name=self.spec.driver_name, node_name=name, node_uid=created.metadata.uid,
            policy_taint=True,
        ):  # fmt: skip
            self._resource.create_resource_slice(slice_)

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self._each(self._renew_one, self.names)
            except Exception as err:  # a missed renewal is retried next period
                log.warning("renewing simulated node leases: %s", err)

    def _renew_one(self, name: str) -> None:
        self._coordination.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": {"renewTime": _now()}})

    def _each(self, action: Any, names: Iterable[str]) -> None:
        with ThreadPoolExecutor(self._parallel) as pool:
            for future in [pool.submit(action, name) for name in names]:
                future.result()

    def delete(self) -> None:
        """Stop the heartbeats and delete slices, nodes and leases (the slices are owned by the nodes,
        but the garbage collector takes a while: deleted here so the next run starts clean)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(RENEW_SECONDS + 5)

        def delete_one(name: str) -> None:
            from kubernetes.client.exceptions import ApiException

            calls: list[Callable[[], Any]] = [
                lambda: self._resource.delete_collection_resource_slice(
                    field_selector=f"spec.nodeName={name}"
                ),
                lambda: self._core.delete_node(name),
                lambda: self._coordination.delete_namespaced_lease(name, LEASE_NAMESPACE),
            ]
            for call in calls:
                try:
                    call()
                except ApiException as err:
                    if err.status != 404:
                        raise

        self._each(delete_one, self.names)
