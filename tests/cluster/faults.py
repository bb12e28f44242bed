"""The fault suite's parts: an API proxy that injects faults, the workload, the invariant check.

* ``ApiFaultProxy`` (``tests/api_proxy.py``, shared with the real API server tier): a TCP proxy on
  loopback between our controller and kube-apiserver (TLS passes through untouched). ``delay``
  holds every byte for a while (a write that hangs), ``cut`` closes every open connection at once,
  so requests in flight are cut mid-write.
* ``Workload``: pods with claims of the seed's classes (binpack, spread, mutex-binpack, mutex),
  memory slices of 1000..6000 MiB, created and deleted at random (seeded) at a steady pace.
* ``check_invariants``: what must hold from the API server's state and the node's files, each
  violation one line: no GPU over its memory, cores or slots (every allocated claim counts, whoever
  allocated it); no mutex claim placed on a card that already had a tenant; every Running pod's
  claims allocated and prepared (CDI spec present); nothing left of deleted claims (CDI spec,
  checkpoint entry, our finalizer); no pod held at our gate while some card fits it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.controller import FINALIZER, GATE_NAME
from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.quantity import parse_bytes, parse_quantity
from hami_dra_dev.cluster.layout import CDI_DIR, Layout
from hami_dra_dev.demo import manifests
from hami_dra_dev.demo.manifests import DemoPod
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DRIVER

RECIPES = ("binpack", "spread", "mutex-binpack", "mutex")
MEMORY_CHOICES_MIB = (1000, 2000, 4000, 6000)
LABEL = "hami-dra.test/fault-run"


# --- workload ---------------------------------------------------------------------------------


@dataclass
class Workload:
    cluster: RealCluster
    rng: random.Random
    max_live: int = 7
    created: int = 0
    live: list[str] = field(default_factory=list)

    def _kubectl(self, *args: str, stdin: str | None = None) -> None:
        """As a controller would: retry while the API server or our webhook is restarting."""
        deadline = time.monotonic() + 90
        while True:
            try:
                self.cluster.kubectl(*args, stdin=stdin)
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def setup(self) -> None:
        objects: list[dict[str, Any]] = [manifests.device_class(r) for r in RECIPES]
        for recipe in RECIPES:
            for mib in MEMORY_CHOICES_MIB:
                template = manifests.claim_template(recipe)
                template["metadata"]["name"] = f"{recipe}-{mib}mi"
                exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
                exactly["capacity"]["requests"]["memory"] = f"{mib}Mi"
                objects.append(template)
        self.cluster.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        )

    def step(self, creates: int = 3) -> None:
        """Delete random live pods down to room for ``creates``, then create ``creates`` pods."""
        self.delete_some(creates)
        self.create(creates)

    def delete_some(self, creates: int = 3) -> None:
        while len(self.live) + creates > self.max_live and self.live:
            victim = self.live.pop(self.rng.randrange(len(self.live)))
            self._kubectl("delete", "pod", victim, "--wait=false", "--ignore-not-found")

    def create(self, creates: int = 3) -> None:
        for _ in range(creates):
            recipe = self.rng.choice(RECIPES)
            mib = self.rng.choice(MEMORY_CHOICES_MIB)
            name = f"fault-{self.created}"
            self.created += 1
            body = manifests.pod(DemoPod(name, recipe, "", ""))
            body["metadata"]["labels"][LABEL] = "true"
            body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = f"{recipe}-{mib}mi"
            self._kubectl("apply", "-f", "-", stdin=json.dumps(body))
            self.live.append(name)

    def delete_all(self) -> None:
        self._kubectl("delete", "pods", "-l", f"{LABEL}=true", "--wait=false")
        self.live.clear()


# --- invariants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    memory: int
    cores: int
    slots: int


def _capacities(cluster: RealCluster) -> dict[str, Capacity]:
    out = {}
    for piece in cluster.get("resourceslices", "--field-selector", f"spec.driver={DRIVER}")["items"]:
        for device in piece["spec"].get("devices") or ():
            cap = device.get("capacity") or {}

            def value(key: str, default: int, cap: dict[str, Any] = cap) -> int:
                return int(parse_quantity(str(cap[key]["value"]))) if key in cap else default

            out[device["name"]] = Capacity(value("memory", 0), value("cores", 100), value("slots", 1 << 30))
    return out


def _results(claim: dict[str, Any]) -> Iterator[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") == DRIVER:
            yield result


def _allocated_at(claim: dict[str, Any]) -> str:
    """The allocation's RFC 3339 timestamp ("" when unallocated); strings of it order in time."""
    return str(((claim.get("status") or {}).get("allocation") or {}).get("allocationTimestamp") or "")


def _is_mutex(claim: dict[str, Any], classes: dict[str, str]) -> bool:
    for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or ():
        policy = classes.get(str((request.get("exactly") or {}).get("deviceClassName", "")), "")
        if "mutex" in policy.split(","):
            return True
    return False


def _class_policies(cluster: RealCluster) -> dict[str, str]:
    policies = {}
    for klass in cluster.get("deviceclasses")["items"]:
        for entry in klass["spec"].get("config") or ():
            parameters = (entry.get("opaque") or {}).get("parameters") or {}
            if parameters.get("policy"):
                policies[klass["metadata"]["name"]] = str(parameters["policy"])
    return policies


def _requested_memory(claim: dict[str, Any]) -> int:
    for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or ():
        memory = ((request.get("exactly") or {}).get("capacity") or {}).get("requests", {}).get("memory")
        if memory:
            return parse_bytes(memory)
    return 0


def check_invariants(cluster: RealCluster, *, settled: bool, cdi_dir: Path = CDI_DIR) -> list[str]:
    """Violations (empty when all hold). ``settled``: also what must hold once nothing is moving."""
    problems: list[str] = []
    capacity = _capacities(cluster)
    claims = cluster.get("resourceclaims")["items"]
    pods = cluster.get("pods", "-l", f"{LABEL}=true")["items"]
    classes = _class_policies(cluster)
    used: dict[str, list[int]] = {}
    tenants: dict[str, list[tuple[str, str]]] = {}
    for claim in claims:
        stamp = _allocated_at(claim)
        for result in _results(claim):
            consumed = result.get("consumedCapacity") or {}
            device = str(result["device"])
            totals = used.setdefault(device, [0, 0, 0])
            totals[0] += parse_bytes(consumed["memory"]) if "memory" in consumed else capacity[device].memory
            totals[1] += int(parse_quantity(str(consumed.get("cores", "0"))))
            totals[2] += int(parse_quantity(str(consumed.get("slots", "1"))))
            tenants.setdefault(device, []).append((stamp, claim["metadata"]["name"]))
    for device, (memory, cores, slots) in sorted(used.items()):
        cap = capacity.get(device)
        if cap is None:
            continue
        if memory > cap.memory or cores > cap.cores or slots > cap.slots:
            problems.append(
                f"{device} overcommitted: memory {memory}/{cap.memory}, cores {cores}/{cap.cores}, "
                f"slots {slots}/{cap.slots}"
            )
    for claim in claims:
        if not _is_mutex(claim, classes):
            continue
        stamp = _allocated_at(claim)
        for result in _results(claim):
            older = [n for s, n in tenants[str(result["device"])] if s and stamp and s < stamp]
            if older:
                problems.append(f"mutex claim {claim['metadata']['name']} placed on {result['device']} "
                                f"already used by {', '.join(older)}")  # fmt: skip
    by_name = {c["metadata"]["name"]: c for c in claims}
    for pod in pods:
        if pod["status"].get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        for status in pod["status"].get("resourceClaimStatuses") or ():
            claim = by_name.get(str(status.get("resourceClaimName")))
            if claim is None or not any(_results(claim)):
                problems.append(f"running pod {pod['metadata']['name']} has an unallocated claim")
            elif not (cdi_dir / CdiNames(DRIVER).spec_file_name(claim["metadata"]["uid"])).is_file():
                problems.append(f"running pod {pod['metadata']['name']}: no CDI spec for its claim")
    if settled:
        uids = {c["metadata"]["uid"] for c in claims}
        prefix = CdiNames(DRIVER).spec_file_name("").removesuffix(".json")
        for spec in cdi_dir.glob(f"{prefix}*.json"):
            uid = spec.name[len(prefix) :].removesuffix(".json")
            if uid not in uids:
                problems.append(f"CDI spec {spec.name} left for a deleted claim")
        checkpoint = Layout(cluster.state_dir).plugin_dir(DRIVER) / "checkpoint.json"
        if checkpoint.is_file():
            for uid in json.loads(checkpoint.read_text()).get("claims") or {}:
                if uid not in uids:
                    problems.append(f"checkpoint entry {uid} left for a deleted claim")
        for claim in claims:
            if claim["metadata"].get("deletionTimestamp") and FINALIZER in (
                claim["metadata"].get("finalizers") or ()
            ):
                problems.append(f"claim {claim['metadata']['name']} deleted but still holds our finalizer")
        free = {d: cap.memory - used.get(d, [0, 0, 0])[0] for d, cap in capacity.items()}
        idle = {d for d in capacity if d not in used}
        for pod in pods:
            gated = any(g.get("name") == GATE_NAME for g in pod["spec"].get("schedulingGates") or ())
            if not gated or pod["metadata"].get("deletionTimestamp"):
                continue
            status = (pod["status"].get("resourceClaimStatuses") or [{}])[0]
            claim = by_name.get(str(status.get("resourceClaimName")))
            if claim is None:
                problems.append(f"gated pod {pod['metadata']['name']} has no claim yet")
                continue
            wanted = _requested_memory(claim)
            fits = idle if _is_mutex(claim, classes) else {d for d, left in free.items() if left >= wanted}
            if fits:
                problems.append(f"pod {pod['metadata']['name']} held at the gate while {sorted(fits)} fit it")
    return problems


def settled(cluster: RealCluster) -> bool:
    """Nothing in motion: no claim being deleted, every test pod Running or waiting at our gate."""
    if any(c["metadata"].get("deletionTimestamp") for c in cluster.get("resourceclaims")["items"]):
        return False
    for pod in cluster.get("pods", "-l", f"{LABEL}=true")["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            return False
        gated = any(g.get("name") == GATE_NAME for g in pod["spec"].get("schedulingGates") or ())
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or ()
        )
        if not gated and not ready:
            return False
    return True


def node_pid(cluster: RealCluster, component: str) -> int:
    """The pid of a cluster component from ``cluster up``'s state file (kept current on restarts)."""
    state = json.loads((cluster.state_dir / "state.json").read_text())
    for entry in state["components"]:
        if entry["name"] == component:
            return int(entry["pid"])
    raise KeyError(component)
