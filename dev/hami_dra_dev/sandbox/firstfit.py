"""kube-scheduler's structured allocation, reduced to plain first fit, for the sandbox.

A real kube-scheduler allocates every unallocated claim of a pod it schedules (that is why the
driver gates its pods and taints its devices). This allocator does the same for the sandbox's
scheduler, written independently of the driver's controller so that it can catch disagreements:

- for the node the scheduler tries, the devices of the *current* pools (highest generation,
  complete) published for it (``nodeName``, ``allNodes`` or a matching ``nodeSelector``), pools,
  slices and devices in name order;
- a device is eligible when the class's and the request's CEL selectors match (via
  ``dra_driver.cel``, Kubernetes' CEL semantics), its ``NoSchedule``/``NoExecute`` taints are
  tolerated by the request, and it is free: unallocated, or ``allowMultipleAllocations`` with
  enough capacity left (the consumable-capacity rules of resource.k8s.io/v1, from
  ``dra_driver/resource/capacity.py``: what a result takes, what a request consumes under the
  device's ``requestPolicy``);
- ``exactly`` (ExactCount / All) and ``firstAvailable`` (first subrequest that fits) requests;
  claims with ``constraints`` are not allocated (reported), as this simple allocator cannot honour them;
- the result carries ``shareID`` + ``consumedCapacity`` for shared devices, the class configs
  (``FromClass``) then the claim configs (``FromClaim``) and a ``nodeSelector`` for the node.
  The scheduler writes it (:mod:`scheduler`, PreBind) together with ``reservedFor``.
"""

from __future__ import annotations

import logging
import math
import uuid
from fractions import Fraction
from typing import Any

from dra_driver.quantity import format_bytes
from dra_driver.resource.capacity import NOTHING, policy_consumption, result_consumption
from dra_driver.resource.nodes import BLOCKING_EFFECTS, taints_tolerated
from hami_dra_dev.sandbox.api import Api
from hami_dra_dev.sandbox.errors import ApiError
from hami_dra_dev.sandbox.fieldcheck import parse_quantity
from hami_dra_dev.sandbox.resources import require
from hami_dra_dev.sandbox.selectors import node_selector_matches

log = logging.getLogger(__name__)
Obj = dict[str, Any]

CLAIMS = require("resource.k8s.io", "v1", "resourceclaims")
SLICES = require("resource.k8s.io", "v1", "resourceslices")
CLASSES = require("resource.k8s.io", "v1", "deviceclasses")
DeviceKey = tuple[str, str, str]  # driver, pool, device


def format_quantity(value: Fraction) -> str:
    """A canonical-enough Kubernetes quantity for an exact amount (binary suffix when it divides)."""
    if value.denominator != 1:
        return f"{math.ceil(value * 1000)}m"
    return format_bytes(int(value))


class FirstFitAllocator:
    """Allocates claims for the sandbox scheduler (see module docstring)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    # ----------------------------------------------------------------------------------- state

    def _in_use(self, in_cycle: list[Obj]) -> tuple[set[DeviceKey], dict[DeviceKey, dict[str, Fraction]]]:
        exclusive: set[DeviceKey] = set()
        shared: dict[DeviceKey, dict[str, Fraction]] = {}
        allocations = [
            (c.get("status") or {}).get("allocation") for c in self.api.list_objects(CLAIMS, None)[0]
        ]
        for alloc in [*allocations, *in_cycle]:
            alloc = alloc or {}
            for res in (alloc.get("devices") or {}).get("results") or []:
                taken = result_consumption(res)
                if taken == NOTHING:
                    continue  # adminAccess
                key = (res["driver"], res["pool"], res["device"])
                if taken.whole_device:
                    exclusive.add(key)
                    continue
                # Every capacity of any driver, exactly as written (kube-scheduler sums them so).
                used = shared.setdefault(key, {})
                for name, qty in (res.get("consumedCapacity") or {}).items():
                    used[name] = used.get(name, Fraction(0)) + (parse_quantity(qty) or Fraction(0))
        return exclusive, shared

    def _devices_for(self, node: Obj) -> list[tuple[str, str, Obj]]:
        """(driver, pool, device) usable on ``node`` from current, complete pools, in name order."""
        slices = self.api.list_objects(SLICES, None)[0]
        pools: dict[tuple[str, str], list[Obj]] = {}
        for s in slices:
            spec = s["spec"]
            pools.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
        out: list[tuple[str, str, Obj]] = []
        for (driver, pool), members in sorted(pools.items()):
            top = max(m["spec"]["pool"]["generation"] for m in members)
            current = sorted(
                (m for m in members if m["spec"]["pool"]["generation"] == top),
                key=lambda m: m["metadata"]["name"],
            )
            if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
                continue  # incomplete pool: nothing of it is allocated
            for s in current:
                spec = s["spec"]
                if spec.get("nodeName") and spec["nodeName"] != node["metadata"]["name"]:
                    continue
                if spec.get("nodeSelector") and not node_selector_matches(spec["nodeSelector"], node):
                    continue
                out.extend((driver, pool, d) for d in spec.get("devices") or [])
        return out

    # ----------------------------------------------------------------------------------- matching

    def _eligible(self, driver: str, device: Obj, req: Obj, class_selectors: list[str]) -> bool:
        from dra_driver.cel import SelectorError, device_input, selectors_match

        if not taints_tolerated(device.get("taints") or (), req.get("tolerations") or (), BLOCKING_EFFECTS):
            return False
        request_selectors = [s["cel"]["expression"] for s in req.get("selectors") or [] if s.get("cel")]
        try:
            cel_input = device_input(driver, device)
            return selectors_match("class", class_selectors, cel_input) and selectors_match(
                "request", request_selectors, cel_input
            )
        except SelectorError as err:
            log.info("first-fit: device %s skipped: %s", device.get("name"), err)
            return False

    def _fit_request(
        self,
        name: str,
        req: Obj,
        devices: list[tuple[str, str, Obj]],
        taken: set[DeviceKey],
        shared: dict[DeviceKey, dict[str, Fraction]],
    ) -> list[Obj] | None:
        try:
            device_class = self.api.get(CLASSES, "", req.get("deviceClassName", ""))
        except ApiError:
            return None
        class_selectors = [
            s["cel"]["expression"]
            for s in (device_class.get("spec") or {}).get("selectors") or []
            if s.get("cel")
        ]
        requested = (req.get("capacity") or {}).get("requests") or {}
        mode = req.get("allocationMode", "ExactCount")
        want = req.get("count", 1)
        results: list[Obj] = []
        for driver, pool, device in devices:
            key = (driver, pool, device["name"])
            if key in taken or not self._eligible(driver, device, req, class_selectors):
                continue
            result: Obj = {"request": name, "driver": driver, "pool": pool, "device": device["name"]}
            if device.get("allowMultipleAllocations"):
                use = policy_consumption(device.get("capacity") or {}, requested)
                if use is None:
                    continue
                used = shared.get(key, {})
                caps = device.get("capacity") or {}
                if any(
                    used.get(c, Fraction(0)) + amount > (parse_quantity(caps[c].get("value")) or Fraction(0))
                    for c, amount in use.items()
                ):
                    continue
                for c, amount in use.items():
                    used[c] = used.get(c, Fraction(0)) + amount
                shared[key] = used
                result["shareID"] = str(uuid.uuid4())
                result["consumedCapacity"] = {c: format_quantity(a) for c, a in use.items()}
            elif key in shared or not self._dedicated_fits(device, requested):
                continue  # a shared device is not free for a dedicated allocation
            taken.add(key)
            results.append(result)
            if mode == "ExactCount" and len(results) == want:
                return results
        return results if mode == "All" and results else None

    @staticmethod
    def _dedicated_fits(device: Obj, requested: dict[str, Any]) -> bool:
        caps = device.get("capacity") or {}
        for name, qty in requested.items():
            if name not in caps:
                return False
            have, want = parse_quantity(caps[name].get("value")), parse_quantity(qty)
            if have is None or want is None or want > have:
                return False
        return True

    def _try(
        self,
        name: str,
        req: Obj,
        devices: list[tuple[str, str, Obj]],
        taken: set[DeviceKey],
        shared: dict[DeviceKey, dict[str, Fraction]],
    ) -> list[Obj] | None:
        """:meth:`_fit_request` on copies of the usage state, committed only when the request fits."""
        trial_taken = set(taken)
        trial_shared = {k: dict(v) for k, v in shared.items()}
        fit = self._fit_request(name, req, devices, trial_taken, trial_shared)
        if fit is not None:
            taken |= trial_taken
            shared.clear()
            shared.update(trial_shared)
        return fit

    # ----------------------------------------------------------------------------------- allocate

    def allocate(self, claim: Obj, node: Obj, in_cycle: list[Obj]) -> Obj | None:
        """An allocation of ``claim`` on ``node`` (not written), or None when it does not fit.

        ``in_cycle`` holds allocations made for the same pod in this scheduling cycle but not
        written yet, so that two claims of one pod never get the same device.
        """
        meta = claim["metadata"]
        devices_spec = (claim.get("spec") or {}).get("devices") or {}
        if devices_spec.get("constraints"):
            log.info(
                "first-fit: claim %s/%s has constraints; not allocating", meta["namespace"], meta["name"]
            )
            return None
        taken, shared = self._in_use(in_cycle)
        devices = self._devices_for(node)
        results: list[Obj] = []
        used_classes: list[tuple[str, str]] = []
        for request in devices_spec.get("requests") or []:
            fit = None
            alternatives = (
                [(request["name"], request["exactly"])]
                if request.get("exactly")
                else [
                    (f"{request['name']}/{sub['name']}", sub) for sub in request.get("firstAvailable") or []
                ]
            )
            for name, body in alternatives:
                fit = self._try(name, body, devices, taken, shared)
                if fit is not None:
                    used_classes.append((request["name"], body.get("deviceClassName", "")))
                    break
            if fit is None:
                return None
            results.extend(fit)
        return self._allocation(claim, node, results, used_classes)

    def _allocation(
        self, claim: Obj, node: Obj, results: list[Obj], used_classes: list[tuple[str, str]]
    ) -> Obj:
        """``status.allocation`` as kube-scheduler builds it: results, class then claim configs, node."""
        config: list[Obj] = []
        for request, class_name in used_classes:
            device_class = self.api.get(CLASSES, "", class_name)
            for entry in (device_class.get("spec") or {}).get("config") or []:
                config.append({"source": "FromClass", "requests": [request], "opaque": entry["opaque"]})
        for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            item = {"source": "FromClaim", "opaque": entry["opaque"]}
            if entry.get("requests"):
                item["requests"] = entry["requests"]
            config.append(item)
        term = {
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node["metadata"]["name"]]}]
        }
        allocation: Obj = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}
        if config:
            allocation["devices"]["config"] = config
        return allocation
