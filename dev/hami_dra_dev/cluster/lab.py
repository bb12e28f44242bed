"""``hami-dra cluster lab``: the worked example's lab on the real cluster, as ``make demo`` shows it
on the sandbox.

Runs against a cluster started by ``hami-dra cluster up`` (or starts one for its own duration):
applies the recipe classes and templates with the real ``kubectl``, creates the worked example's
pods in order, and checks what real Kubernetes did with them: the device each pod got, the controller's
scores for the ``mutex,binpack`` pod (from its decision log line), the CUDA limit that containerd
injected from our CDI spec (``kubectl logs``), and a ``mutex`` pod that stays Pending until a
card is freed. Every pod is deleted at the end. Exit 0 only if every check held.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from dra_driver.resource.objects import ClaimView
from hami_dra_dev.cluster.layout import NODE_NAME, Layout
from hami_dra_dev.demo import manifests, render
from hami_dra_dev.demo.checks import Checks
from hami_dra_dev.demo.manifests import DemoPod
from hami_dra_dev.demo.observe import allocated_device, parse_pod

T = TypeVar("T")
MEMORY_LIMIT_ENV = "CUDA_DEVICE_MEMORY_LIMIT_0=1000m"
CONFLICT = "4/4 ExclusiveDeviceAllocateConflict"


class LabFailure(Exception):
    """A step could not go on (a pod never ran, kubectl failed)."""


class Lab:
    def __init__(self, layout: Layout, kubectl: Path, console: Console, timeout: float = 90.0) -> None:
        self.layout = layout
        self.kubectl_path = kubectl
        self.console = console
        self.timeout = timeout
        self.checks = Checks()

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        command = [str(self.kubectl_path), "--kubeconfig", str(self.layout.admin_kubeconfig), *args]
        result = subprocess.run(
            command, capture_output=True, text=True, input=stdin, timeout=self.timeout + 30, check=False
        )
        if result.returncode != 0:
            raise LabFailure(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def wait(self, check: Callable[[], T | None], what: str) -> T:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            result = check()
            if result:
                return result
            time.sleep(0.2)
        raise LabFailure(f"{what}: not within {self.timeout:.0f}s")

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl(
            "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        )

    def device(self, pod: str) -> str | None:
        """The device allocated to the pod's claim (None until its claim is created), read as the
        demo reads it (``dev/hami_dra_dev/demo/observe.py``)."""
        claim = parse_pod(self.get("pod", pod)).claim
        if claim is None:
            return None
        return allocated_device(ClaimView(self.get("resourceclaim", claim), manifests.DRIVER))

    def place(self, demo_pod: DemoPod) -> str:
        self.apply(manifests.pod(demo_pod))
        self.kubectl(
            "wait", "--for=condition=Ready", f"pod/{demo_pod.name}", f"--timeout={self.timeout:.0f}s"
        )
        device = self.device(demo_pod.name) or "-"
        self.checks.expect(
            f"{demo_pod.name} ({demo_pod.policy}) Running on", demo_pod.expected_device, device
        )
        return device

    def scores(self, pod: str) -> dict[str, float]:
        log = (self.layout.logs / "controller.log").read_text(errors="replace")
        lines = [line for line in log.splitlines() if f"pod {manifests.NAMESPACE}/{pod} " in line]
        if not lines:
            raise LabFailure(f"the controller logged no decision for {pod}")
        found = re.findall(rf"{NODE_NAME}/(gpu-\d+)=(\d+\.\d+)", lines[-1].split("scores: ", 1)[1])
        return {card: float(value) for card, value in found}

    def run(self) -> Checks:
        try:
            self._run()
        except LabFailure as err:
            self.checks.fail("lab step", "completes", str(err))
        finally:
            self.console.print("cleaning up: deleting the lab's pods")
            subprocess.run(
                [str(self.kubectl_path), "--kubeconfig", str(self.layout.admin_kubeconfig), "delete", "pods",
                 "--all", "--wait=true", "--timeout=90s"],
                capture_output=True, check=False, timeout=120,
            )  # fmt: skip
        return self.checks

    def _run(self) -> None:
        self.console.rule("1. kubectl get resourceslices (real kube-apiserver)", align="left")
        self.console.print(self.kubectl("get", "resourceslices"))
        recipes = list(manifests.CLASS_POLICIES)
        self.apply(
            *(manifests.device_class(r) for r in recipes), *(manifests.claim_template(r) for r in recipes)
        )
        self.console.rule(
            "2. The worked example's pods in order: our controller places, kube-scheduler binds", align="left"
        )
        rows = []
        for demo_pod in (*manifests.TENANTS, manifests.LATENCY):
            rows.append(
                (demo_pod.name, demo_pod.policy, demo_pod.expected_device, self.place(demo_pod), demo_pod.why)
            )
        self.console.print(render.placements_table(rows))
        scores = self.scores(manifests.LATENCY.name)
        self.console.print(f"controller scores for {manifests.LATENCY.name}: {scores}")
        expected = dict(zip(("gpu-0", "gpu-1", "gpu-2", "gpu-3"), manifests.EXPECTED_SCORES, strict=True))
        self.checks.expect("scores of GPU 0..3", expected, scores)
        env = self.kubectl("logs", manifests.LATENCY.name)
        self.console.print(render.text_panel(f"$ kubectl logs {manifests.LATENCY.name}", env))
        self.checks.expect(
            "limit injected by containerd from our CDI spec", True, MEMORY_LIMIT_ENV in env.split()
        )
        self.console.rule("3. A mutex pod waits for an idle card", align="left")
        self.place(manifests.FILLER)
        self.apply(manifests.pod(manifests.EXCLUSIVE))

        def conflict_reported() -> str | None:
            text = self.kubectl("describe", "pod", manifests.EXCLUSIVE.name)
            return text if CONFLICT in text else None

        described = self.wait(conflict_reported, f"{manifests.EXCLUSIVE.name} reporting {CONFLICT}")
        tail = "\n".join(described.splitlines()[-6:])
        self.console.print(
            render.text_panel(f"$ kubectl describe pod {manifests.EXCLUSIVE.name} (tail)", tail)
        )
        self.kubectl("delete", "pod", manifests.FILLER.name, "--wait=true", f"--timeout={self.timeout:.0f}s")
        self.place(manifests.EXCLUSIVE)
