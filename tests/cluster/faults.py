"""The fault suite's parts: an API proxy that injects faults, the workload, the invariant check.

* ``ApiFaultProxy`` (``tests/api_proxy.py``, shared with the real API server tier): a TCP proxy on
  loopback between our controller and kube-apiserver (TLS passes through untouched). ``delay``
  holds every byte for a while (a write that hangs), ``cut`` closes every open connection at once,
  so requests in flight are cut mid-write.
* ``Workload``: pods with claims of the seed's classes (binpack, spread, mutex-binpack, mutex),
  memory slices of 1000..6000 MiB, created and deleted at random (seeded) at a steady pace; for
  the faults that need them, gangs (the coscheduling label, the minimum in our annotation) and
  pods that fill cards or preempt.
* ``check_invariants``: what must hold from the API server's state and the node's files, each
  violation one line: no GPU over its memory, cores or slots (every allocated claim counts, whoever
  allocated it); no mutex claim placed on a card that already had a tenant; every Running pod's
  claims allocated and prepared (CDI spec present); nothing left of deleted claims (CDI spec,
  checkpoint entry, our finalizer); no pod held at our gate while some card fits it, nor a gang
  while its members fit together; no capacity held by a gated pod (a member of an incomplete gang
  holds no allocation); no gang with fewer members past the gate than its minimum while others wait.
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
from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL
from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.quantity import parse_bytes, parse_quantity
from hami_dra_dev.cluster.layout import CDI_DIR, Layout
from hami_dra_dev.demo import manifests
from hami_dra_dev.demo.manifests import DemoPod
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DRIVER
from tests.cluster.refusal import refused_template

RECIPES = ("binpack", "spread", "mutex-binpack", "mutex")
MEMORY_CHOICES_MIB = (1000, 2000, 4000, 6000)
LABEL = "hami-dra.test/fault-run"
#: A pod that fills a T4 (14967 MiB published) but for 967 MiB, and one that needs 10 GiB: only
#: by preemption while every card is filled.
FILL_MIB, URGENT_MIB = 14000, 10240
URGENT_CLASS = "hami-dra-test-fault-urgent"
#: Fillers trap SIGTERM: a victim terminates for this long, the window a controller is killed in.
FILL_GRACE = 4
REFUSED_TEMPLATE = "gang-refused-2000mi"


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
        for mib in (FILL_MIB, URGENT_MIB):
            template = manifests.claim_template("binpack")
            template["metadata"]["name"] = f"binpack-{mib}mi"
            template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][
                "memory"
            ] = f"{mib}Mi"
            objects.append(template)
        refused = manifests.claim_template("binpack")["spec"]["spec"]["devices"]["requests"][0]
        refused["exactly"]["capacity"]["requests"]["memory"] = "2000Mi"
        objects.append(refused_template(REFUSED_TEMPLATE, manifests.NAMESPACE, refused))
        objects.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": URGENT_CLASS}, "value": 1000,
                        "description": "hami-dra fault suite: a pod that preempts"})  # fmt: skip
        self.cluster.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        )

    def teardown(self) -> None:
        self.cluster.kubectl("delete", "priorityclass", URGENT_CLASS, "--ignore-not-found")

    def step(self, creates: int = 3) -> None:
        """Delete random live pods down to room for ``creates``, then create ``creates`` pods."""
        self.delete_some(creates)
        self.create(creates)

    def delete_some(self, creates: int = 3) -> None:
        while len(self.live) + creates > self.max_live and self.live:
            victim = self.live.pop(self.rng.randrange(len(self.live)))
            self._kubectl("delete", "pod", victim, "--wait=false", "--ignore-not-found")

    def _pod(self, recipe: str, template: str) -> dict[str, Any]:
        name = f"fault-{self.created}"
        self.created += 1
        body = manifests.pod(DemoPod(name, recipe, "", ""))
        body["metadata"]["labels"][LABEL] = "true"
        body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
        return body

    def _submit(self, *bodies: dict[str, Any]) -> list[str]:
        """Create the pods in one request (a gang's members arrive together) and track them."""
        self._kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                             "items": list(bodies)}))  # fmt: skip
        names = [str(body["metadata"]["name"]) for body in bodies]
        self.live += names
        return names

    def create(self, creates: int = 3) -> None:
        for _ in range(creates):
            recipe = self.rng.choice(RECIPES)
            mib = self.rng.choice(MEMORY_CHOICES_MIB)
            self._submit(self._pod(recipe, f"{recipe}-{mib}mi"))

    def create_gang(self, size: int, refused: int) -> list[str]:
        """A gang of ``size`` members of random classes and memory (the coscheduling label, the
        minimum in our annotation); member ``refused`` gets a claim whose allocation the API server
        refuses while tests/cluster/refusal.py's policy is installed."""
        group = f"fault-gang-{self.created}"
        members = []
        for index in range(size):
            recipe = self.rng.choice(RECIPES)
            template = (
                REFUSED_TEMPLATE if index == refused else f"{recipe}-{self.rng.choice(MEMORY_CHOICES_MIB)}mi"
            )
            body = self._pod("binpack" if index == refused else recipe, template)
            body["metadata"]["labels"][POD_GROUP_LABEL] = group
            body["metadata"].setdefault("annotations", {})[MIN_MEMBERS_ANNOTATION] = str(size)
            members.append(body)
        return self._submit(*members)

    def create_fillers(self, count: int) -> list[str]:
        """Pods that fill a card each and, preempted, terminate for ``FILL_GRACE`` seconds."""
        bodies = []
        for _ in range(count):
            body = self._pod("binpack", f"binpack-{FILL_MIB}mi")
            body["spec"]["terminationGracePeriodSeconds"] = FILL_GRACE
            body["spec"]["containers"][0]["command"] = ["sh", "-c", "trap '' TERM; sleep 86400"]
            bodies.append(body)
        return self._submit(*bodies)

    def create_urgent(self) -> str:
        """A pod of a higher priority than every other that fits only where one is preempted."""
        body = self._pod("binpack", f"binpack-{URGENT_MIB}mi")
        body["spec"]["priorityClassName"] = URGENT_CLASS
        (name,) = self._submit(body)
        return name

    def delete(self, name: str) -> None:
        self.live.remove(name)
        self._kubectl("delete", "pod", name, "--wait=false", "--ignore-not-found")

    def delete_all(self) -> None:
        self._kubectl("delete", "pods", "-l", f"{LABEL}=true", "--wait=false")
        self.live.clear()


# --- invariants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capacity:
    memory: int
    cores: int
    slots: int


def card_count(cluster: RealCluster) -> int:
    """The devices our driver publishes (the real node's mock cards)."""
    return len(_capacities(cluster))


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
        problems += _gate_problems(pods, by_name, classes, free, idle)
    return problems


def gated(pod: dict[str, Any]) -> bool:
    """Held at our scheduling gate."""
    return any(g.get("name") == GATE_NAME for g in pod["spec"].get("schedulingGates") or ())


def _gate_problems(
    pods: list[dict[str, Any]],
    claims: dict[str, dict[str, Any]],
    classes: dict[str, str],
    free: dict[str, int],
    idle: set[str],
) -> list[str]:
    """Once settled: no gated pod holds capacity, none waits while a card fits it, no gang waits
    while its members fit together, and no gang has fewer members past the gate than its minimum
    while others wait."""
    problems = []
    gangs: dict[str, list[dict[str, Any]]] = {}
    wants: dict[str, tuple[bool, int]] = {}  # gated pod -> (mutex?, memory)
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        name = pod["metadata"]["name"]
        group = (pod["metadata"].get("labels") or {}).get(POD_GROUP_LABEL)
        if group:
            gangs.setdefault(group, []).append(pod)
        if not gated(pod):
            continue
        status = (pod["status"].get("resourceClaimStatuses") or [{}])[0]
        claim = claims.get(str(status.get("resourceClaimName")))
        if claim is None:
            problems.append(f"gated pod {name} has no claim yet")
            continue
        if any(_results(claim)):
            problems.append(f"gated pod {name} holds the allocation of claim {claim['metadata']['name']}")
        wants[name] = (_is_mutex(claim, classes), _requested_memory(claim))
        if group:
            continue  # judged with its gang below
        mutex, wanted = wants[name]
        fits = idle if mutex else {d for d, left in free.items() if left >= wanted}
        if fits:
            problems.append(f"pod {name} held at the gate while {sorted(fits)} fit it")
    for group, members in sorted(gangs.items()):
        waiting = [m["metadata"]["name"] for m in members if gated(m)]
        if not waiting:
            continue
        minimum = max(
            int((m["metadata"].get("annotations") or {}).get(MIN_MEMBERS_ANNOTATION, "0")) for m in members
        )
        admitted = len(members) - len(waiting)
        if 0 < admitted < minimum:
            problems.append(
                f"gang {group}: {admitted} member(s) past the gate, needs {minimum}, {waiting} wait"
            )
        complete = admitted == 0 and len(members) >= minimum and all(n in wants for n in waiting)
        if complete and _fit_together([wants[n] for n in waiting], free, idle):
            problems.append(f"gang {group} held at the gate while its members {waiting} fit together")
    return problems


def _fit_together(wants: list[tuple[bool, int]], free: dict[str, int], idle: set[str]) -> bool:
    """Whether the controller places every member (mutex?, memory) in whatever order and by
    whatever policy it plans them: an idle card for each member (each takes at most one, and a
    workload slice fits an empty card), or, without a mutex member, one card with room for all
    of them (whatever the others took, it keeps room for the rest)."""
    if len(idle) >= len(wants):
        return True
    return not any(mutex for mutex, _ in wants) and max(free.values(), default=0) >= sum(m for _, m in wants)


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


def preempted_by_us(pod: dict[str, Any]) -> bool:
    """A pod terminating because our controller preempted it (its DisruptionTarget condition)."""
    conditions = (pod.get("status") or {}).get("conditions") or ()
    marked = any(
        c["type"] == "DisruptionTarget" and c.get("reason") == "PreemptionByHamiDra" for c in conditions
    )
    return bool(pod["metadata"].get("deletionTimestamp")) and marked
