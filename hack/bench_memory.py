#!/usr/bin/env python3
"""The controller's memory and initial sync time at full scale (issue 35 item 3).

    .venv/bin/python hack/bench_memory.py [--nodes 5000] [--gpus 8] [--pods 50000] [--ours 4000]
        [--other-slices 0] [--compare main] [--tracemalloc] [--out report.json]

A controller that does not lead (a standby: it lists and watches and plans nothing) runs its
real informers against an in-memory API server that answers like a real one: each list (or
page) is generated, serialized to JSON bytes and decoded by the client, so every object the
controller keeps is freshly decoded, nothing shared with the generator, and an unpaged list
costs what it costs over HTTP (the whole response's bytes, then its decoded dicts). The objects
have the shapes a real cluster lists (``kubectl get -o json`` of a Deployment's pod, a GPU node
with its images and GPU feature labels, our kubelet plugin's ResourceSlices, our allocated
template claims), each with the managedFields the API server records for the managers that
write it. The cluster: ``--nodes`` nodes of ``--gpus`` H100s, ``--pods`` pods bound round-robin,
``--ours`` of which are ours (an allocated template claim each, gate lifted, running); the rest
are other workloads' pods. ``--other-slices``: another driver's slices per node (a NIC driver).

Each measurement runs in a fresh process, after a warm-up sync of a tiny cluster (which imports
what the controller imports lazily): RSS before the informers start, after the initial sync
(the informers have listed; the worker has applied every event to the cache and built the
inventory) and the process's peak RSS (VmHWM); the time to list, the time until the cache is
ready and the CPU time spent until then (the fake server's share is reading pre-encoded lines
from a file, next to nothing; a real API server's work is not counted). ``--tracemalloc`` adds a
second run per code under tracemalloc (Python allocations: current and peak; slower).
``--compare REV`` runs the same measurements on the code of git revision REV (extracted to a
temporary directory) and reports both.

The report is one JSON object on stdout (and in ``--out``): the parameters, each code's runs,
and what its cache holds (pods, claims, devices, the CPU requested on the nodes), which must be
equal between codes for the comparison to mean anything.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DRIVER = "gpu.hami.io"
GATE = "gpu.hami.io/allocation"  # dra_driver.contract.GATE_NAME and FINALIZER
PROFILE = "h100-80gb"
GIB = 2**30
Obj = dict[str, Any]


# --- recorded-shape objects -----------------------------------------------------------------------


#: Lists the API server tracks whole (``listType=atomic``): a manager owns them as one field.
ATOMIC_LISTS = frozenset(
    {
        "containerStatuses",
        "initContainerStatuses",
        "images",
        "tolerations",
        "capabilities",
        "drop",
        "sources",
        "items",
        "devices",
        "results",
        "nodeSelectorTerms",
        "matchFields",
        "values",
        "requests",
        "finalizers",
        "podCIDRs",
        "hostIPs",
    }
)
#: The keys of the other lists' items (``listMapKey``).
LIST_KEYS = ("name", "type", "containerPort", "mountPath", "uid", "ip")


def fields_v1(value: Any, name: str = "") -> Any:
    """The ``fieldsV1`` tree the API server records for a manager that wrote ``value``."""
    if isinstance(value, dict):
        return {f"f:{key}": fields_v1(item, key) for key, item in value.items()}
    if (
        isinstance(value, list)
        and value
        and name not in ATOMIC_LISTS
        and all(isinstance(i, dict) for i in value)
    ):
        tree: Obj = {}
        for item in value:
            key = {k: item[k] for k in LIST_KEYS if k in item} or {"index": len(tree)}
            tree[f"k:{json.dumps(key, separators=(',', ':'))}"] = {".": {}, **fields_v1(item)}
        return tree
    return {}


def managed(manager: str, operation: str, when: str, fields: Obj, subresource: str | None = None) -> Obj:
    entry: Obj = {
        "manager": manager,
        "operation": operation,
        "apiVersion": "v1",
        "time": when,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(fields),
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def stamp(index: int) -> str:
    return f"2026-11-{1 + index % 28:02}T{index % 24:02}:{index % 60:02}:{(index * 7) % 60:02}Z"


def node_name(index: int) -> str:
    return f"gpu-node-{index:05}"


def a_node(index: int, gpus: int) -> Obj:
    name, when = node_name(index), stamp(index)
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abcd'[index % 4]}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.machine": "p5.48xlarge",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "4",
        "nvidia.com/gfd.timestamp": "1764547200",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mps.capable": "false",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1015-aws",
    }
    annotations = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "nfd.node.kubernetes.io/feature-labels": ",".join(
            k for k in labels if "feature" in k or "nvidia" in k
        ),
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{index:017x}"}),
    }
    status: Obj = {
        "addresses": [
            {"type": "InternalIP", "address": f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"},
            {"type": "Hostname", "address": name},
            {"type": "InternalDNS", "address": f"ip-10-0-{index // 256 % 256}-{index % 256}.ec2.internal"},
        ],
        "allocatable": {
            "cpu": "191450m",
            "ephemeral-storage": "27845546346",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            "memory": "2012445656Ki",
            "pods": "737",
        },
        "capacity": {
            "cpu": "192",
            "ephemeral-storage": "30416376Ki",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            "memory": "2097135064Ki",
            "pods": "737",
        },
        "conditions": [
            {
                "type": kind,
                "status": "False" if kind != "Ready" else "True",
                "lastHeartbeatTime": when,
                "lastTransitionTime": when,
                "reason": f"Kubelet{kind}",
                "message": f"kubelet reports {kind}",
            }
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "images": [
            {
                "names": [
                    f"registry.example.com/team-{i % 9}/image-{i}@sha256:{i:064x}",
                    f"registry.example.com/team-{i % 9}/image-{i}:v1.{i}.0",
                ],
                "sizeBytes": 10**8 + i,
            }
            for i in range(40)
        ],
        "nodeInfo": {
            "architecture": "amd64",
            "bootID": f"{index:032x}",
            "containerRuntimeVersion": "containerd://1.7.22",
            "kernelVersion": "6.8.0-1015-aws",
            "kubeProxyVersion": "",
            "kubeletVersion": "v1.34.2",
            "machineID": f"{index:032x}",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 22.04.5 LTS",
            "systemUUID": f"ec2{index:029x}",
        },
    }
    spec = {
        "podCIDR": f"100.{index // 256 % 256}.{index % 256}.0/24",
        "providerID": f"aws:///us-east-1a/i-{index:017x}",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{index:08x}-0000-4000-8000-000000000001",
            "resourceVersion": str(10**6 + index),
            "creationTimestamp": when,
            "labels": labels,
            "annotations": annotations,
            "managedFields": [
                managed("kubelet", "Update", when, {"metadata": {"annotations": {}, "labels": labels}}),
                managed("kube-controller-manager", "Update", when, {"spec": spec}),
                managed("nfd-master", "Update", when, {"metadata": {"annotations": annotations}}),
                managed("kubelet", "Update", when, {"status": status}, "status"),
            ],
        },
        "spec": spec,
        "status": status,
    }


def a_container(name: str, image: str, cpu: str, memory: str, claim: str | None) -> Obj:
    resources: Obj = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if claim:
        resources["claims"] = [{"name": claim}]
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "env": [{"name": f"SETTING_{i}", "value": f"value-{i}"} for i in range(5)]
        + [
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            }
        ],
        "resources": resources,
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "successThreshold": 1,
            "timeoutSeconds": 1,
        },
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
            "periodSeconds": 5,
            "failureThreshold": 3,
            "successThreshold": 1,
            "timeoutSeconds": 1,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {"mountPath": "/etc/app", "name": "config", "readOnly": True},
            {
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "name": "kube-api-access",
                "readOnly": True,
            },
        ],
    }


def a_pod(index: int, nodes: int, ours: bool) -> Obj:
    """A running pod of a Deployment; ``ours``: one of our GPU pods (a template claim, placed by
    us: our decision record and HAMi's annotation on it)."""
    namespace = f"{'ml' if ours else 'app'}-{index % 97}"
    workload = f"{'train' if ours else 'web'}-{index % 500}"
    name = f"{workload}-{index % 8999:04x}d5c-{index:06x}"
    node, when = node_name(index % nodes), stamp(index)
    uid = f"{index:08x}-1111-4000-8000-{index:012x}"
    labels = {
        "app.kubernetes.io/name": workload,
        "app.kubernetes.io/part-of": namespace,
        "pod-template-hash": f"{index % 8999:04x}d5c",
    }
    annotations = {"kubectl.kubernetes.io/restartedAt": when}
    claims = [{"name": "gpu", "resourceClaimTemplateName": f"{workload}-gpu"}] if ours else []
    containers = [
        a_container(
            "app",
            f"registry.example.com/{workload}:v1.{index % 40}.0",
            "500m",
            "1Gi",
            "gpu" if ours else None,
        )
    ]
    if index % 3 == 0:
        containers.append(a_container("sidecar", "registry.example.com/proxy:v2.1.0", "100m", "128Mi", None))
    if ours:
        annotations[f"{DRIVER}/decision"] = json.dumps(
            {
                "node": node,
                "cards": [index % 8],
                "policy": "binpack",
                "scores": {f"gpu-{i}": 0.5 + i / 100 for i in range(8)},
            }
        )
        annotations["hami.io/vgpu-devices-allocated"] = f"GPU-{index:08x}-0000,NVIDIA,20480,30:;"
    spec: Obj = {
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "nodeName": node,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {"fsGroup": 2000},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "tolerationSeconds": 300,
            },
            {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "tolerationSeconds": 300,
            },
        ],
        "volumes": [
            {"name": "config", "configMap": {"defaultMode": 420, "name": f"{workload}-config"}},
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                "name": "kube-root-ca.crt",
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        "path": "namespace",
                                    }
                                ]
                            }
                        },
                    ],
                },
            },
        ],
    }
    if claims:
        spec["resourceClaims"] = claims
    status: Obj = {
        "conditions": [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": when}
            for kind in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ],
        "containerStatuses": [
            {
                "containerID": f"containerd://{index:064x}",
                "image": c["image"],
                "imageID": f"{c['image']}@sha256:{index:064x}",
                "lastState": {},
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": when}},
                "volumeMounts": [
                    {
                        "mountPath": m["mountPath"],
                        "name": m["name"],
                        "readOnly": True,
                        "recursiveReadOnly": "Disabled",
                    }
                    for m in c["volumeMounts"]
                ],
            }
            for c in containers
        ],
        "hostIP": f"10.0.{index % nodes // 256 % 256}.{index % nodes % 256}",
        "hostIPs": [{"ip": f"10.0.{index % nodes // 256 % 256}.{index % nodes % 256}"}],
        "phase": "Running",
        "podIP": f"100.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}",
        "podIPs": [{"ip": f"100.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}"}],
        "qosClass": "Burstable",
        "startTime": when,
    }
    if ours:
        status["resourceClaimStatuses"] = [
            {"name": "gpu", "resourceClaimName": f"{name}-gpu-{index % 99999:05}"}
        ]
    metadata: Obj = {
        "name": name,
        "generateName": name[:-6],
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": str(2 * 10**6 + index),
        "creationTimestamp": when,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": "ReplicaSet",
                "name": f"{workload}-{index % 8999:04x}d5c",
                "uid": f"rs-{index % 500}",
            }
        ],
    }
    metadata["managedFields"] = [
        managed(
            "kube-controller-manager",
            "Update",
            when,
            {
                "metadata": {k: metadata[k] for k in ("generateName", "labels", "ownerReferences")},
                "spec": spec,
            },
        ),
        managed("kubelet", "Update", when, {"status": status}, "status"),
    ]
    if ours:
        metadata["managedFields"].append(
            managed("hami-dra-controller", "Update", when, {"metadata": {"annotations": annotations}})
        )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def a_claim(index: int, nodes: int, gpus: int) -> Obj:
    """The template claim of our pod ``index``, allocated by us on its node (a 20 GiB share)."""
    pod = a_pod(index, nodes, ours=True)
    meta, node = pod["metadata"], pod["spec"]["nodeName"]
    name, when = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"], meta["creationTimestamp"]
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DRIVER,
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "capacity": {"requests": {"memory": "20Gi", "cores": "30"}},
                    },
                }
            ]
        }
    }
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": node,
                        "device": f"gpu-{index // nodes % gpus}",
                        "shareID": f"{index:08x}-2222-4000-8000-{index:012x}",
                        "consumedCapacity": {"memory": "20Gi", "cores": "30", "slots": "1"},
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}],
    }
    metadata: Obj = {
        "name": name,
        "namespace": meta["namespace"],
        "uid": f"{index:08x}-3333-4000-8000-{index:012x}",
        "resourceVersion": str(3 * 10**6 + index),
        "creationTimestamp": when,
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
        "finalizers": [GATE],
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            }
        ],
    }
    metadata["managedFields"] = [
        managed(
            "kube-controller-manager",
            "Update",
            when,
            {"metadata": {"annotations": {}, "ownerReferences": []}, "spec": spec},
        ),
        managed("hami-dra-controller", "Update", when, {"metadata": {"finalizers": []}}),
        managed("hami-dra-controller", "Update", when, {"status": status}, "status"),
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }


def slices_of(index: int, gpus: int, other: int) -> list[Obj]:
    """Our kubelet plugin's slices for node ``index`` (and ``other`` slices of another driver)."""
    from dra_driver.devices.simulated import profile_gpus
    from dra_driver.resource.slice_builder import build_resource_slices

    node, when = node_name(index), stamp(index)
    found = build_resource_slices(
        profile_gpus(PROFILE, node_name=node, gpus=gpus), node_name=node, driver_name=DRIVER
    )
    for number in range(other):
        found.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-nic.example.com-{number}"},
                "spec": {
                    "driver": "nic.example.com",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": other},
                    "devices": [
                        {
                            "name": f"nic-{i}",
                            "attributes": {
                                "pciBusID": {"string": f"0000:{i:02x}:00.0"},
                                "rdma": {"bool": True},
                            },
                        }
                        for i in range(8)
                    ],
                },
            }
        )
    for number, item in enumerate(found):
        meta = item["metadata"]
        meta.update(
            uid=f"{index:08x}-4444-4000-8000-{number:012x}",
            resourceVersion=str(4 * 10**6 + index),
            creationTimestamp=when,
            ownerReferences=[
                {
                    "apiVersion": "v1",
                    "controller": True,
                    "kind": "Node",
                    "name": node,
                    "uid": f"{index:08x}-0000-4000-8000-000000000001",
                }
            ],
        )
        meta["managedFields"] = [managed("kubelet-plugin", "Update", when, {"spec": item["spec"]})]
    return found


# --- the API server --------------------------------------------------------------------------------

#: What is listed, generated once per parameters into a directory the measured processes read.
PLURALS = ("deviceclasses", "nodes", "resourceslices", "resourceclaims", "pods")


def generate(args: argparse.Namespace, into: Path) -> dict[str, int]:
    """Every listed object as one line of JSON per object (``<plural>.jsonl``) with its offset,
    length and driver (slices) in ``<plural>.idx``; returns the bytes per resource."""
    step = max(1, args.pods // args.ours) if args.ours else 0
    ours = [index * step for index in range(min(args.ours, args.pods))] if step else []
    ours_set = set(ours)
    klass = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER, "uid": "class", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    sources: dict[str, Callable[[], Iterator[Obj]]] = {
        "deviceclasses": lambda: iter([klass]),
        "nodes": lambda: (a_node(i, args.gpus) for i in range(args.nodes)),
        "resourceslices": lambda: (
            s for i in range(args.nodes) for s in slices_of(i, args.gpus, args.other_slices)
        ),
        "resourceclaims": lambda: (a_claim(i, args.nodes, args.gpus) for i in ours),
        "pods": lambda: (a_pod(i, args.nodes, i in ours_set) for i in range(args.pods)),
    }
    sizes = {}
    for plural in PLURALS:
        index, offset = [], 0
        with (into / f"{plural}.jsonl").open("wb") as lines:
            for obj in sources[plural]():
                line = json.dumps(obj, separators=(",", ":")).encode()
                lines.write(line)
                index.append((offset, len(line), (obj.get("spec") or {}).get("driver", "")))
                offset += len(line)
        (into / f"{plural}.idx").write_text(json.dumps(index))
        sizes[plural] = offset
    return sizes


class FakeApi:
    """List and watch of the generated cluster, answered like a real API server: a list (or one
    page of it) is the objects' JSON, which the client decodes as ``Kube.list`` does (so nothing
    is shared between objects, and an unpaged list holds the whole response's bytes while it is
    decoded). The server's own work is reading pre-encoded lines: next to nothing."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._index = {
            plural: [tuple(entry) for entry in json.loads((data / f"{plural}.idx").read_text())]
            for plural in PLURALS
        }

    def list(
        self,
        resource: Any,
        *,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_from: str | None = None,
        **_: Any,
    ) -> Obj:
        from dra_driver.kube.errors import KubeError

        if resource.plural == "gpuquotas":
            raise KubeError(404, "the server could not find the requested resource")
        with self._lock:
            self.calls[resource.plural] = self.calls.get(resource.plural, 0) + 1
        entries = self._index.get(resource.plural, [])
        if field_selector:
            wanted = field_selector.removeprefix("spec.driver=")
            entries = [entry for entry in entries if entry[2] == wanted]
        start = int(continue_from or 0)
        end = min(len(entries), start + limit) if limit else len(entries)
        body = bytearray(b'{"metadata":{"resourceVersion":"9000000"')
        if end < len(entries):
            body += f',"continue":"{end}"'.encode()
        body += b'},"items":['
        if end > start:
            with (self.data / f"{resource.plural}.jsonl").open("rb") as lines:
                for number, (offset, length, _driver) in enumerate(entries[start:end]):
                    lines.seek(offset)
                    body += (b"," if number else b"") + lines.read(length)
        body += b"]}"
        page: Obj = json.loads(body)  # the client's decoding, as Kube.list does
        del body
        return page

    def watch(
        self, resource: Any, resource_version: str, timeout_seconds: int = 300, **_: Any
    ) -> Iterator[Obj]:
        self._stopped.wait(timeout_seconds)  # nothing changes during the measurement
        return iter(())

    def get(self, resource: Any, namespace: str | None, name: str) -> Obj:
        raise NotImplementedError("the benchmark's controller does not lead: it reads nothing")

    create = update = get  # type: ignore[assignment]


# --- one measurement (a child process) -------------------------------------------------------------


def memory_kib() -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of this process, in KiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def sync(data: Path, page_size: int | None, timeout: float) -> tuple[Any, FakeApi, float, float, float]:
    """A standby controller (it plans nothing) whose informers listed ``data`` and whose worker
    applied every event; returns it, its API, the seconds to list and to have the cache, and the
    CPU seconds the process spent until then (all threads: less sensitive to the machine's load
    than the wall clock)."""
    from dra_driver.controller.controller import Controller

    api = FakeApi(data)
    controller = Controller(api, DRIVER, write_workers=0, is_leader=lambda: False)
    for informer in controller.informers.values():
        if page_size is not None and hasattr(informer, "page_size"):
            informer.page_size = page_size
    started, cpu = time.perf_counter(), time.process_time()
    for informer in controller.informers.values():
        informer.start()
    for informer in controller.informers.values():
        if not informer.synced.wait(timeout):
            raise SystemExit(f"{informer.resource.plural} not listed within {timeout}s")
    listed = time.perf_counter()
    controller.run_once()  # the worker applies every queued event: the cache is ready
    return controller, api, listed - started, time.perf_counter() - started, time.process_time() - cpu


class CollectorTime:
    """Time spent in Python's cyclic garbage collector (a ``gc.callbacks`` entry), and how many
    full (generation 2) collections ran: each walks every live container object."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info.get("generation") == 2


def measure(args: argparse.Namespace) -> Obj:
    """Memory and time of one initial sync, after a warm-up sync of a tiny cluster (which imports
    what the controller imports lazily: CEL, the engine), so that only the caches are counted."""
    import tracemalloc

    warm, *_ = sync(args.data / "warm-up", args.page_size, args.timeout)
    for informer in warm.informers.values():
        informer.stop()
    del warm
    gc.collect()
    before = memory_kib()
    if args.trace:
        tracemalloc.start()
    collector = CollectorTime()
    gc.callbacks.append(collector)
    controller, api, listed, ready, cpu = sync(args.data / "cluster", args.page_size, args.timeout)
    traced = tracemalloc.get_traced_memory() if args.trace else None
    if args.trace:
        tracemalloc.stop()
    gc.collect()
    after = memory_kib()
    cache = controller.cache
    bound = cache.bound_requests()
    result: Obj = {
        "rss_before_mib": round(before["VmRSS"] / 1024, 1),
        "rss_after_mib": round(after["VmRSS"] / 1024, 1),
        "rss_growth_mib": round((after["VmRSS"] - before["VmRSS"]) / 1024, 1),
        "peak_rss_mib": round(after["VmHWM"] / 1024, 1),
        "peak_growth_mib": round((after["VmHWM"] - before["VmRSS"]) / 1024, 1),
        "list_seconds": round(listed, 2),
        "sync_seconds": round(ready, 2),
        "sync_cpu_seconds": round(cpu, 2),
        "gc_seconds": round(collector.seconds, 2),
        "gc_full_collections": collector.full,
        "list_calls": dict(sorted(api.calls.items())),
        "cache": {
            "pods": len(cache.pods),
            "claims": len(cache.claims),
            "nodes": len(cache.nodes),
            "devices": sum(len(node.devices) for node in cache.ledger.inventory.values()),
            "bound_cpu_cores": round(sum(node["cpu"] for node in bound.values()), 3),
            "bound_memory_gib": round(sum(node["memory"] for node in bound.values()) / GIB, 3),
        },
    }
    if traced is not None:
        result["tracemalloc_current_mib"] = round(traced[0] / 2**20, 1)
        result["tracemalloc_peak_mib"] = round(traced[1] / 2**20, 1)
    return result


# --- the report ------------------------------------------------------------------------------------


def extract(revision: str, into: Path) -> Path:
    """The tree of git revision ``revision`` (its code only), under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "dra_driver"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def child(code: Path, data: Path, args: argparse.Namespace, trace: bool) -> Obj:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--code",
        str(code),
        "--data",
        str(data),
        "--timeout",
        str(args.timeout),
    ]
    if args.page_size is not None:
        command += ["--page-size", str(args.page_size)]
    if trace:
        command.append("--trace")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measurement failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: Obj = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {json.dumps(result)}", file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--ours", type=int, default=4000, help="pods of ours (a claim each) among --pods")
    parser.add_argument("--other-slices", type=int, default=0, help="another driver's slices per node")
    parser.add_argument(
        "--page-size", type=int, default=None, help="informers' page size (default: the code's)"
    )
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV's code (e.g. main)")
    parser.add_argument("--tracemalloc", action="store_true", help="a second run per code under tracemalloc")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, str(args.code))
        logging_quiet()
        print(json.dumps(measure(args)))
        sys.stdout.flush()
        os._exit(0)  # informer threads sleep in their watch
    sys.path.insert(0, str(ROOT))
    report: Obj = {
        "benchmark": "controller memory and initial sync (hack/bench_memory.py)",
        "parameters": {
            key: getattr(args, key) for key in ("nodes", "gpus", "pods", "ours", "other_slices", "page_size")
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average_before": [round(x, 2) for x in os.getloadavg()],
        },
        "codes": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        data = Path(tmp) / "data"
        for name, shape in (("warm-up", dict(nodes=1, pods=3, ours=1)), ("cluster", {})):
            (data / name).mkdir(parents=True)
            sizes = generate(argparse.Namespace(**{**vars(args), **shape}), data / name)
        report["json_bytes_mib"] = {plural: round(size / 2**20, 1) for plural, size in sizes.items()}
        print(f"generated: {report['json_bytes_mib']}", file=sys.stderr)
        codes = {"this checkout": ROOT}
        if args.compare:
            codes = {args.compare: extract(args.compare, Path(tmp) / "code"), **codes}
        for label, code in codes.items():
            print(f"measuring {label} ...", file=sys.stderr)
            runs = {"plain": child(code, data, args, trace=False)}
            if args.tracemalloc:
                runs["tracemalloc"] = child(code, data, args, trace=True)
            report["codes"][label] = runs
    report["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def logging_quiet() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)


if __name__ == "__main__":
    raise SystemExit(main())
