#!/usr/bin/env python3
"""Scale: the controller at 5,000 nodes x 8 GPUs with 50,000 pods (issue 35 item 6).

    .venv/bin/python hack/bench_scale.py [--nodes 5000] [--gpus 8] [--pods 50000] [--ours 4000]
        [--foreign-rate 50] [--foreign-seconds 30] [--ours-churn 1000] [--report PATH]

A real API server holding this many objects does not fit beside everything else on a 2-core
machine, so the controller runs in this process against ``RecordedApi``: an in-memory KubeApi
that stores every object as the JSON the API server would send and serves it like one (a list is
one JSON document parsed by the client, a watch a stream of JSON events, writes checked against
the resourceVersion), fed with generated objects shaped like the real ones: Nodes with their
images and conditions, the ResourceSlices our kubelet plugin publishes, pods with managed fields,
owner references, volumes and a running status. ``--pods`` pods are bound and running, ``--ours`` of
them with one of our claims (allocated, reserved), the rest foreign (no claim of ours).

Measured, in order:

1. *initial sync*: from ``Controller.start()`` until every informer has listed and the worker has
   applied every object (the first pass done);
2. *controller RSS*: the process's RSS after the sync less its RSS before the controller started
   (the API's stored JSON is in both); the peak (VmHWM) is reported too;
3. */metrics scrape*: the page the controller's metrics server serves for Prometheus's Accept
   header (OpenMetrics), once cold (every piece rendered) and 5 times warm (each piece's text kept
   while published: ``dra_driver/metrics_page.py``), and its size; for comparison, one render of
   every sample through prometheus_client (what each scrape cost before);
4. *foreign churn*: for ``--foreign-seconds`` seconds ``--foreign-rate`` foreign pods a second are
   created, bound, set running and an old one deleted (4 watch events each): the CPU of the
   controller's threads (all but this benchmark's main thread, which plays the API server and the
   workload) per second and per event;
5. *our churn*: ``--ours-churn`` of our running pods end (pod and claim deleted) and as many new
   ones arrive (a claim and a gated pod each), 50 a second: decision latency p50/p99 (the
   planner's ``plan`` call per pod) and the controller's CPU per pod until every gate is lifted.

The writes the controller makes go to RecordedApi, whose JSON encoding of them runs on the
controller's writer threads (the real client encodes the request body too). Figures, not
assertions; the report (JSON, with the commit and the machine) goes to docs/bench/scale.json at
full size, else docs/bench/scale-validation.json; hack/perf_tables.py renders it.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import ctypes
import gc
import itertools
import json
import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "hack"))

import bench_report  # noqa: E402
from bench_controller import TimedPlanner  # noqa: E402

from dra_driver.kube.api import Obj, Resource, patch_content_type  # noqa: E402
from dra_driver.kube.errors import KubeError  # noqa: E402
from dra_driver.metrics_page import PROMETHEUS_ACCEPT  # noqa: E402
from hami_dra_dev.sandbox.errors import ApiError  # noqa: E402
from hami_dra_dev.sandbox.patch import apply_patch  # noqa: E402

DRIVER = "gpu.hami.io"
PROFILE = "h100-80gb"
GATE = "gpu.hami.io/allocation"
REPORT = ROOT / "docs" / "bench" / "scale.json"
VALIDATION_REPORT = ROOT / "docs" / "bench" / "scale-validation.json"
#: Resources with a status subresource.
WITH_STATUS = {"pods", "resourceclaims", "nodes"}
FULL = {"nodes": 5000, "gpus": 8, "pods": 50000}


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- the API ---------------------------------------------------------------------------------------
def _field_terms(field_selector: str | None) -> list[tuple[str, str]]:
    """A field selector's ``path=value`` terms (equality only, as the controller sends them)."""
    terms = []
    for term in (field_selector or "").split(","):
        if term:
            path, _, value = term.partition("=")
            terms.append((path, value))
    return terms


def _selected(raw: bytes, terms: list[tuple[str, str]]) -> bool:
    """Whether the stored object ``raw`` has every ``path=value`` field of a field selector."""
    return not terms or _has_fields(json.loads(raw), terms)


def _has_fields(obj: Any, terms: list[tuple[str, str]]) -> bool:
    for path, value in terms:
        node = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


class RecordedApi:
    """The controller's KubeApi over objects stored as the API server's JSON (see the module doc)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], bytes]] = {}
        self._rv = itertools.count(1)
        self.resource_version = 0
        self._lock = threading.Condition()
        #: Per resource: the watch events in resourceVersion order (their versions beside them).
        self._event_rvs: dict[str, list[int]] = {}
        self._events: dict[str, list[bytes]] = {}
        self.closed = False

    # --- storing ----------------------------------------------------------------------------------
    def _stamp(self, resource: Resource, obj: Obj) -> bytes:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        self.resource_version = next(self._rv)
        meta["resourceVersion"] = str(self.resource_version)
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        return json.dumps(obj, separators=(",", ":")).encode()

    def load(self, resource: Resource, obj: Obj) -> None:
        """Store ``obj`` as if it had been there before anyone watched (no event)."""
        with self._lock:
            raw = self._stamp(resource, obj)
            meta = obj["metadata"]
            self.objects.setdefault(resource.plural, {})[(meta.get("namespace") or "", meta["name"])] = raw

    def _emit(self, resource: Resource, kind: str, raw: bytes) -> None:
        self._event_rvs.setdefault(resource.plural, []).append(self.resource_version)
        self._events.setdefault(resource.plural, []).append(
            b'{"type":"%s","object":%s}' % (kind.encode(), raw)
        )
        self._lock.notify_all()

    def bytes_of(self, plural: str) -> list[int]:
        return [len(raw) for raw in self.objects.get(plural, {}).values()]

    # --- KubeApi -----------------------------------------------------------------------------------
    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        raw = self.objects.get(resource.plural, {}).get((namespace or "", name))
        if raw is None:
            raise KubeError(404, f'{resource.plural} "{name}" not found')
        return dict(json.loads(raw))

    def list(
        self,
        resource: Resource,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
    ) -> Obj:
        """The stored objects in key order, as the API server pages them: ``limit`` items from
        after ``continue_from`` (the key of the previous page's last item), with a ``continue``
        token while more remain; ``field_selector``: ``path=value`` terms (equality only, each
        object decoded to test it, as the API server does)."""
        terms = _field_terms(field_selector)
        after = tuple(json.loads(continue_from)) if continue_from else None
        with self._lock:
            stored = sorted(self.objects.get(resource.plural, {}).items())
            version = self.resource_version
        keys = [key for key, raw in stored if (after is None or key > after) and _selected(raw, terms)]
        page = keys[:limit] if limit else keys
        chosen = dict(stored)
        continue_token = (
            b',"continue":%s' % json.dumps(json.dumps(list(page[-1]))).encode()
            if len(page) < len(keys)
            else b""
        )
        body = b'{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"%d"%s},"items":[%s]}' % (
            version,
            continue_token,
            b",".join(chosen[key] for key in page),
        )
        return dict(json.loads(body))

    def create(self, resource: Resource, namespace: str | None, obj: Obj) -> Obj:
        body = json.loads(json.dumps(obj))
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if namespace:
            meta["namespace"] = namespace
        meta.pop("resourceVersion", None)
        if resource.plural == "events":  # recorded nowhere: nothing here reads them
            return dict(body)
        with self._lock:
            store = self.objects.setdefault(resource.plural, {})
            key = (meta.get("namespace") or "", meta["name"])
            if key in store:
                raise KubeError(409, f'{resource.plural} "{meta["name"]}" already exists')
            raw = store[key] = self._stamp(resource, body)
            self._emit(resource, "ADDED", raw)
        return dict(body)

    def update(self, resource: Resource, obj: Obj, *, status: bool = False) -> Obj:
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        with self._lock:
            store = self.objects.get(resource.plural, {})
            if key not in store:
                raise KubeError(404, f'{resource.plural} "{meta["name"]}" not found')
            current = json.loads(store[key])
            if str(meta.get("resourceVersion")) != current["metadata"]["resourceVersion"]:
                raise KubeError(
                    409, "the object has been modified; please apply your changes to the latest version"
                )
            if status:
                new = current
                new["status"] = json.loads(json.dumps(obj.get("status") or {}))
            else:
                new = json.loads(json.dumps(obj))
                if resource.plural in WITH_STATUS:
                    new["status"] = current.get("status") or {}
                new["metadata"]["uid"] = current["metadata"]["uid"]
            raw = store[key] = self._stamp(resource, new)
            self._emit(resource, "MODIFIED", raw)
        return dict(new)

    def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        status: bool = False,
        strategic: bool = False,
    ) -> Obj:
        """The binder's gate and condition patches, applied as the sandbox applies them (a failed
        JSON-patch ``test`` is 422; a uid that is not the object's 422, as kube-apiserver answers)."""
        key = (namespace or "", name)
        with self._lock:
            store = self.objects.get(resource.plural, {})
            if key not in store:
                raise KubeError(404, f'{resource.plural} "{name}" not found')
            current = json.loads(store[key])
            try:
                patched = apply_patch(
                    patch_content_type(patch, strategic=strategic), current, json.dumps(patch).encode()
                )
            except ApiError as err:
                raise KubeError(err.code, err.message) from None
            if patched["metadata"].get("uid") != current["metadata"]["uid"]:
                raise KubeError(422, "metadata.uid: field is immutable")
            if status:
                new = current
                new["status"] = patched.get("status") or {}
            else:
                new = patched
                if resource.plural in WITH_STATUS:
                    new["status"] = current.get("status") or {}
            raw = store[key] = self._stamp(resource, new)
            self._emit(resource, "MODIFIED", raw)
        return dict(new)

    def delete(self, resource: Resource, namespace: str | None, name: str) -> None:
        """The workload's deletions (the controller deletes nothing)."""
        with self._lock:
            raw = self.objects.get(resource.plural, {}).pop((namespace or "", name), None)
            if raw is None:
                return
            obj = json.loads(raw)
            raw = self._stamp(resource, obj)
            self._emit(resource, "DELETED", raw)

    def watch(
        self,
        resource: Resource,
        resource_version: str,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> Any:
        plural = resource.plural
        terms = _field_terms(field_selector)
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            rvs, events = self._event_rvs.setdefault(plural, []), self._events.setdefault(plural, [])
            index = bisect.bisect_right(rvs, int(resource_version or 0))
        while time.monotonic() < deadline and not self.closed:
            with self._lock:
                if index >= len(events):
                    self._lock.wait(0.5)
                batch = events[index:]
            index += len(batch)
            for raw in batch:
                event = json.loads(raw)
                if _has_fields(event.get("object") or {}, terms):
                    yield event


# --- objects shaped like the API server's ----------------------------------------------------------
IMAGES = [f"registry.example.com/team-{i % 7}/service-{i}:v1.{i}.0" for i in range(24)]


def node_object(name: str, index: int) -> Obj:
    """A Node as a kubelet on a GPU machine reports it: labels, addresses, capacity, conditions,
    node info and the images it holds (the bulk of a real Node's JSON)."""
    conditions = [
        {
            "type": kind,
            "status": "False",
            "reason": f"Kubelet{reason}",
            "message": f"kubelet has {reason}",
            "lastHeartbeatTime": "2026-12-01T00:00:00Z",
            "lastTransitionTime": "2026-11-01T00:00:00Z",
        }
        for kind, reason in (
            ("MemoryPressure", "HasSufficientMemory"),
            ("DiskPressure", "HasNoDiskPressure"),
            ("PIDPressure", "HasSufficientPID"),
        )
    ] + [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-12-01T00:00:00Z",
            "lastTransitionTime": "2026-11-01T00:00:00Z",
        }
    ]
    resources = {
        "cpu": "96",
        "memory": "1056000000Ki",
        "pods": "250",
        "ephemeral-storage": "3750000000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": f"zone-{index % 3}",
                "topology.kubernetes.io/region": "region-1",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                "feature.node.kubernetes.io/pci-10de.present": "true",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": f"10.{index // 256 % 256}.{index % 256}.0/24",
            "providerID": f"aws:///zone/i-{index:017x}",
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 256 % 256}.{index % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": uuid.UUID(int=index).hex,
                "systemUUID": str(uuid.UUID(int=index + 1)),
                "bootID": str(uuid.UUID(int=index + 2)),
                "kernelVersion": "6.8.0-1019-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://2.0.4",
                "kubeletVersion": "v1.34.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {"names": [f"{image}@sha256:{uuid.UUID(int=i).hex * 2}", image], "sizeBytes": 10**8 + i}
                for i, image in enumerate(IMAGES)
            ],
        },
    }


def pod_object(name: str, namespace: str, node: str | None, index: int, claim: str | None = None) -> Obj:
    """A Deployment's pod as the API server returns it (managed fields, owner, projected token
    volume, default tolerations, a running status); ``claim``: one of our claims in its spec."""
    app = f"app-{index % 500}"
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGES[index % len(IMAGES)],
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "env": [
            {"name": "APP", "value": app},
            {"name": "LOG_LEVEL", "value": "info"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {
                "key": f"node.kubernetes.io/{t}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for t in ("not-ready", "unreachable")
        ],
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ],
                },
            }
        ],
    }
    if claim is not None:
        container["resources"]["claims"] = [{"name": "gpu"}]
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    if node is not None:
        spec["nodeName"] = node
    fields = {
        "f:metadata": {
            "f:generateName": {},
            "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {".": {}, 'k:{"uid":"x"}': {}},
        },
        "f:spec": {
            "f:containers": {
                'k:{"name":"main"}': {".": {}, "f:env": {}, "f:image": {}, "f:ports": {}, "f:resources": {}}
            }
        },
    }
    pod: Obj = {
        "metadata": {
            "name": name,
            "generateName": f"{app}-5d9c7b8f4-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": "5d9c7b8f4"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-5d9c7b8f4",
                    "uid": str(uuid.UUID(int=index % 500)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                }
            ],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }
    if node is not None:
        pod["status"] = running_status(index)
    return pod


def running_status(index: int) -> Obj:
    ip = f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}"
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": "2026-12-01T00:00:05Z"}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.0.1",
        "hostIPs": [{"ip": "10.0.0.1"}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": "2026-12-01T00:00:01Z",
        "qosClass": "Burstable",
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "image": IMAGES[index % len(IMAGES)],
                "imageID": f"{IMAGES[index % len(IMAGES)]}@sha256:{'ab' * 32}",
                "containerID": f"containerd://{uuid.UUID(int=index).hex * 2}",
                "state": {"running": {"startedAt": "2026-12-01T00:00:04Z"}},
                "lastState": {},
                "volumeMounts": [
                    {
                        "name": "kube-api-access",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True,
                        "recursiveReadOnly": "Disabled",
                    }
                ],
            }
        ],
    }


def our_claim(
    name: str, namespace: str, node: str | None, device: str | None, pod_name: str, pod_uid: str
) -> Obj:
    """One of our claims (one GPU, a 10 GiB slice); allocated and reserved when ``node`` is given."""
    claim: Obj = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": "10Gi"}},
                        },
                    }
                ]
            }
        },
    }
    if node is not None:
        claim["metadata"]["finalizers"] = [f"{DRIVER}/allocation"]
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": device,
                            "shareID": str(uuid.uuid4()),
                            "consumedCapacity": {"memory": "10Gi", "cores": "10", "slots": "1"},
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_uid}],
        }
    return claim


# --- measuring -------------------------------------------------------------------------------------
def rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def settle_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so RSS says what is held."""
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def threads_cpu(exclude: set[int]) -> float:
    """CPU seconds of this process's threads but ``exclude`` (native ids), from /proc/self/task."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) in exclude:
            continue
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def wait(condition: Any, timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(poll)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=FULL["nodes"])
    parser.add_argument("--gpus", type=int, default=FULL["gpus"])
    parser.add_argument("--pods", type=int, default=FULL["pods"], help="running pods in all")
    parser.add_argument("--ours", type=int, default=4000, help="of them ours (one claim each)")
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--foreign-rate", type=float, default=50.0)
    parser.add_argument("--foreign-seconds", type=float, default=30.0)
    parser.add_argument(
        "--ours-churn", type=int, default=1000, help="our pods replaced (ending and arriving)"
    )
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for our new pods")
    args = parser.parse_args(argv)
    if args.ours > min(args.pods, args.nodes * args.gpus):
        parser.error("--ours: at most --pods and one per GPU")
    full = args.nodes >= FULL["nodes"] and args.gpus >= FULL["gpus"] and args.pods >= FULL["pods"]
    report_path = args.report or (REPORT if full else VALIDATION_REPORT)
    logging.basicConfig(level=logging.ERROR)

    from prometheus_client import generate_latest

    from dra_driver.controller.controller import Controller
    from dra_driver.devices.simulated import profile_gpus
    from dra_driver.kube.api import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
    from dra_driver.resource.slice_builder import build_resource_slices

    provenance = bench_report.provenance()
    load_before = bench_report.load_average()
    main_thread = {threading.get_native_id()}
    api = RecordedApi()
    started = time.perf_counter()
    log(f"generating {args.nodes} nodes x {args.gpus} GPUs, {args.pods} pods ({args.ours} ours)")
    node_names = [f"gpu-node-{i:05d}" for i in range(args.nodes)]
    for index, name in enumerate(node_names):
        api.load(NODES, node_object(name, index))
        for body in build_resource_slices(
            profile_gpus(PROFILE, node_name=name, gpus=args.gpus), node_name=name, driver_name=DRIVER
        ):
            api.load(RESOURCE_SLICES, body)
    api.load(
        DEVICE_CLASSES,
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    namespaces = [f"team-{i:02d}" for i in range(args.namespaces)]
    ours: list[tuple[str, str]] = []  # (namespace, name) of our running pods
    for index in range(args.pods):
        namespace = namespaces[index % len(namespaces)]
        if index < args.ours:
            node, device = node_names[index % args.nodes], f"gpu-{index // args.nodes % args.gpus}"
            name, uid = f"ours-{index:06d}", str(uuid.uuid4())
            body = pod_object(name, namespace, node, index, claim=name)
            body["metadata"]["uid"] = uid
            api.load(PODS, body)
            api.load(RESOURCE_CLAIMS, our_claim(name, namespace, node, device, name, uid))
            ours.append((namespace, name))
        else:
            api.load(PODS, pod_object(f"web-{index:06d}", namespace, node_names[index % args.nodes], index))
    pod_bytes = api.bytes_of("pods")
    total_bytes = sum(sum(api.bytes_of(plural)) for plural in api.objects)
    generated_s = time.perf_counter() - started
    settle_memory()
    rss_before = rss_mib()
    log(f"generated in {generated_s:.0f} s: {total_bytes / 2**20:.0f} MiB of JSON; RSS {rss_before:.0f} MiB")

    # 1. initial sync
    controller = Controller(api, DRIVER, background_events=True)
    decisions: list[float] = []
    controller.allocator.planner = TimedPlanner(controller.allocator.planner, decisions)
    cpu0, wall0 = threads_cpu(main_thread), time.perf_counter()
    controller.start(sync_timeout=3600)
    listed_s = time.perf_counter() - wall0
    wait(lambda: controller.passes >= 1 and not controller._events, 3600, "the first pass after the sync")
    sync_s, sync_cpu = time.perf_counter() - wall0, threads_cpu(main_thread) - cpu0
    log(f"informers listed in {listed_s:.1f} s, first pass done at {sync_s:.1f} s ({sync_cpu:.1f} CPU-s)")

    # 2. RSS
    # The per-card series are rebuilt at most once a second, by the worker: wait until every
    # node's are published (a fixed sleep missed them on a loaded machine: a 4 KiB scrape).
    controller.wake()
    wait(
        lambda: len(controller.metrics.gpu_series.nodes) >= args.nodes and controller._series_published,
        600,
        "the per-card series published",
    )
    settle_memory()
    rss_after, peak = rss_mib(), rss_mib("VmHWM")
    log(f"RSS {rss_after:.0f} MiB (controller {rss_after - rss_before:.0f} MiB), peak {peak:.0f} MiB")

    # 3. /metrics: the page the metrics server serves Prometheus (it asks for OpenMetrics). A
    # served controller renders it in the background after a term's first publish (the warm-up,
    # off any scrape); the scrapes then reuse what did not change (here: nothing)
    t = time.perf_counter()
    warming = controller.metrics.registry.warm(PROMETHEUS_ACCEPT)
    if warming is not None:
        warming.join()
    warm_up = time.perf_counter() - t
    log(f"/metrics warm-up (in the background after the first publish): {1000 * warm_up:.0f} ms")
    scrapes, size = [], 0
    for _ in range(6):
        t = time.perf_counter()
        size = len(controller.metrics.registry.page(PROMETHEUS_ACCEPT)[0])
        scrapes.append(time.perf_counter() - t)
    first_scrape, scrapes = scrapes[0], scrapes[1:]
    log(
        f"/metrics: first {1000 * first_scrape:.0f} ms, then {1000 * min(scrapes):.0f}-"
        f"{1000 * max(scrapes):.0f} ms, {size / 1024:.0f} KiB"
    )
    settle_memory()
    rss_after_scrape = rss_mib()  # the kept text of every piece is held from the first scrape on
    t = time.perf_counter()
    generate_latest(controller.metrics.registry)
    collect_all = time.perf_counter() - t

    # 4. foreign pods churn
    foreign = [(ns, name) for (ns, name) in api.objects["pods"] if name.startswith("web-")]
    events = 0
    cpu0, wall0 = threads_cpu(main_thread), time.perf_counter()
    count = int(args.foreign_rate * args.foreign_seconds)
    for i in range(count):
        delay = wall0 + i / args.foreign_rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        namespace, index = namespaces[i % len(namespaces)], args.pods + i
        name = f"web-new-{i:06d}"
        created = api.create(PODS, namespace, pod_object(name, namespace, None, index))
        created["spec"]["nodeName"] = node_names[index % args.nodes]
        bound = api.update(PODS, created)
        bound["status"] = running_status(index)
        api.update(PODS, bound, status=True)
        gone_ns, gone = foreign[i % len(foreign)]
        api.delete(PODS, gone_ns, gone)
        events += 4
    churn_s = time.perf_counter() - wall0
    time.sleep(1.0)  # the last events reach the controller
    churn_cpu = threads_cpu(main_thread) - cpu0
    log(f"foreign churn: {count} pods in {churn_s:.1f} s, controller {churn_cpu:.2f} CPU-s")

    # 5. our pods ending and arriving
    decisions.clear()
    replaced = min(args.ours_churn, len(ours))
    cpu0, wall0 = threads_cpu(main_thread), time.perf_counter()
    new_pods = []
    for i in range(replaced):
        delay = wall0 + i / 50.0 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        namespace, name = ours[i]
        api.delete(PODS, namespace, name)
        api.delete(RESOURCE_CLAIMS, namespace, name)
        new = f"ours-new-{i:06d}"
        api.create(RESOURCE_CLAIMS, namespace, our_claim(new, namespace, None, None, new, ""))
        body = pod_object(new, namespace, None, args.pods + i, claim=new)
        body["spec"]["schedulingGates"] = [{"name": GATE}]
        api.create(PODS, namespace, body)
        new_pods.append((namespace, new))

    def all_ungated() -> bool:
        store = api.objects["pods"]
        return not any(json.loads(store[key])["spec"].get("schedulingGates") for key in new_pods)

    wait(all_ungated, args.timeout, f"{replaced} new pods of ours ungated", poll=0.5)
    ours_s, ours_cpu = time.perf_counter() - wall0, threads_cpu(main_thread) - cpu0
    ours_decisions = sorted(decisions)
    log(
        f"our churn: {replaced} pods in {ours_s:.1f} s, {ours_cpu:.1f} CPU-s, "
        f"decision p99 {1000 * bench_report.percentile(ours_decisions, 0.99):.1f} ms"
    )
    controller.stop()
    api.closed = True

    results = {
        "generate_s": round(generated_s, 1),
        "informers_listed_s": round(listed_s, 2),
        "initial_sync_s": round(sync_s, 2),
        "initial_sync_cpu_s": round(sync_cpu, 2),
        "rss_before_controller_mib": round(rss_before),
        "rss_after_sync_mib": round(rss_after),
        "controller_rss_mib": round(rss_after - rss_before),
        "peak_rss_mib": round(peak),
        "scrape_warm_up_ms": round(1000 * warm_up, 1),
        "scrape_ms_first": round(1000 * first_scrape, 1),
        "scrape_ms_median": round(1000 * sorted(scrapes)[len(scrapes) // 2], 1),
        "collect_all_ms": round(1000 * collect_all, 1),
        "controller_rss_after_scrape_mib": round(rss_after_scrape - rss_before),
        "scrape_ms_max": round(1000 * max(scrapes), 1),
        "scrape_kib": round(size / 1024),
        "foreign_churn_per_s": args.foreign_rate,
        "foreign_churn_s": args.foreign_seconds,
        "foreign_churn_achieved_per_s": round(count / churn_s, 1),
        "foreign_churn_cpu_per_s": round(churn_cpu / churn_s, 4),
        "foreign_churn_cpu_ms_per_event": round(1000 * churn_cpu / max(events, 1), 3),
        "ours_churn_pods": replaced,
        "ours_churn_s": round(ours_s, 2),
        "ours_churn_cpu_ms_per_pod": round(1000 * ours_cpu / max(replaced, 1), 2),
        "decisions": len(ours_decisions),
        "decision_p50_ms": round(1000 * bench_report.percentile(ours_decisions, 0.5), 2),
        "decision_p99_ms": round(1000 * bench_report.percentile(ours_decisions, 0.99), 2),
        "ours_churn_decision_p99_ms": round(1000 * bench_report.percentile(ours_decisions, 0.99), 2),
    }
    report = {
        "purpose": "figures" if full else "validation of the harness (smaller than the full run)",
        **provenance,
        "full_command": "make bench-scale",
        "load_average": {"before": load_before, "after": bench_report.load_average()},
        "command": " ".join(["hack/bench_scale.py", *argv]),
        "config": {
            "nodes": args.nodes,
            "gpus": args.gpus,
            "pods": args.pods,
            "ours_pods": args.ours,
            "namespaces": args.namespaces,
        },
        "objects": {
            "pods": len(pod_bytes),
            "pod_bytes_mean": round(sum(pod_bytes) / len(pod_bytes)),
            "node_bytes_mean": round(sum(api.bytes_of("nodes")) / max(1, len(api.bytes_of("nodes")))),
            "slices": len(api.bytes_of("resourceslices")),
            "total_mib": round(total_bytes / 2**20, 1),
        },
        "results": results,
        "real_cluster": (
            "The real control plane at this size was not measured: hack/bench_cluster.py --nodes N runs "
            "it at the largest size this machine holds (see docs/performance.md)."
        ),
    }
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    print(f"(report: {report_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
