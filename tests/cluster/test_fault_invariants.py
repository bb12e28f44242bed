"""The fault suite's invariant check on hand-made API states: it must see every kind of damage.

No cluster needed: a fake ``RealCluster`` answers ``get`` from dicts, the node's files (checkpoint,
CDI specs) live in a temporary directory.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.controller import FINALIZER, GATE_NAME
from dra_driver.controller.gang_refs import MIN_MEMBERS_ANNOTATION, POD_GROUP_LABEL
from dra_driver.kubeletplugin.cdi import CdiNames
from hami_dra_dev.cluster.layout import Layout
from hami_dra_dev.demo import manifests
from tests.cluster.faults import LABEL, check_invariants, settled

DRIVER = manifests.DRIVER


class FakeCluster:
    def __init__(self, state_dir: Path, claims: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.state_dir = state_dir
        self.objects = {
            "resourceslices": [
                {
                    "spec": {
                        "devices": [
                            {
                                "name": f"gpu-{i}",
                                "capacity": {"memory": {"value": "15Gi"}, "cores": {"value": "100"}},
                            }
                            for i in range(2)
                        ]
                    }
                }
            ],
            "resourceclaims": claims,
            "pods": pods,
            "deviceclasses": [manifests.device_class(r) for r in ("binpack", "mutex")],
        }

    def get(self, kind: str, *args: str) -> dict[str, Any]:
        return {"items": self.objects[kind]}


def claim(
    name: str,
    recipe: str,
    device: str | None,
    memory: str = "8Gi",
    stamp: str = "2026-12-01T10:00:00Z",
    **meta: Any,
) -> dict[str, Any]:
    exactly = {"deviceClassName": manifests.class_name(recipe), "capacity": {"requests": {"memory": memory}}}
    body: dict[str, Any] = {
        "metadata": {"name": name, "uid": str(uuid.uuid4()), **meta},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    if device:
        result = {"request": "gpu", "driver": DRIVER, "pool": "n", "device": device,
                  "consumedCapacity": {"memory": memory, "cores": "0", "slots": "1"}}  # fmt: skip
        body["status"] = {"allocation": {"devices": {"results": [result]}, "allocationTimestamp": stamp}}
    return body


def pod(name: str, claim_name: str, *, running: bool = False, gated: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": {"schedulingGates": [{"name": GATE_NAME}] if gated else []},
        "status": {
            "phase": "Running" if running else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if running else "False"}],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    Layout(tmp_path).plugin_dir(DRIVER).mkdir(parents=True)
    return tmp_path


def test_a_healthy_state_has_no_violation(state_dir: Path) -> None:
    ok = claim("a", "binpack", "gpu-0")
    (state_dir / CdiNames(DRIVER).spec_file_name(ok["metadata"]["uid"])).write_text("{}")
    cluster: Any = FakeCluster(state_dir, [ok], [pod("p", "a", running=True)])
    assert check_invariants(cluster, settled=True, cdi_dir=state_dir) == []
    assert settled(cluster)


def test_overcommit_mutex_sharing_and_a_stuck_gate_are_seen(state_dir: Path) -> None:
    claims = [
        claim("a", "binpack", "gpu-0", "10Gi", "2026-12-01T10:00:00Z"),
        claim("b", "binpack", "gpu-0", "10Gi", "2026-12-01T10:00:01Z"),
        claim("m", "mutex", "gpu-0", "1Gi", "2026-12-01T10:00:02Z"),
        claim("waiting", "binpack", None, "1Gi"),
    ]
    cluster: Any = FakeCluster(state_dir, claims, [pod("w", "waiting", gated=True)])
    problems = check_invariants(cluster, settled=True, cdi_dir=state_dir)
    assert any(p.startswith("gpu-0 overcommitted: memory") for p in problems), problems
    assert any(p.startswith("mutex claim m placed on gpu-0 already used by a, b") for p in problems), problems
    assert any("pod w held at the gate while ['gpu-1'] fit it" in p for p in problems), problems


def test_leftovers_of_deleted_claims_are_seen(state_dir: Path) -> None:
    gone = str(uuid.uuid4())
    checkpoint = Layout(state_dir).plugin_dir(DRIVER) / "checkpoint.json"
    checkpoint.write_text(json.dumps({"claims": {gone: {}}}))
    spec = state_dir / CdiNames(DRIVER).spec_file_name(gone)
    spec.write_text("{}")
    deleting = claim(
        "d", "binpack", "gpu-1", deletionTimestamp="2026-12-01T10:00:00Z", finalizers=[FINALIZER]
    )
    running_unprepared = claim("r", "binpack", "gpu-1", "1Gi")
    cluster: Any = FakeCluster(state_dir, [deleting, running_unprepared], [pod("p", "r", running=True)])
    problems = check_invariants(cluster, settled=True, cdi_dir=state_dir)
    assert f"CDI spec {spec.name} left for a deleted claim" in problems
    assert f"checkpoint entry {gone} left for a deleted claim" in problems
    assert "claim d deleted but still holds our finalizer" in problems
    assert "running pod p: no CDI spec for its claim" in problems
    assert not settled(cluster), "a claim being deleted is motion"


def member(name: str, claim_name: str, group: str, minimum: int, **state: bool) -> dict[str, Any]:
    body = pod(name, claim_name, **state)
    body["metadata"]["labels"][POD_GROUP_LABEL] = group
    body["metadata"]["annotations"] = {MIN_MEMBERS_ANNOTATION: str(minimum)}
    return body


def test_a_gang_short_of_its_minimum_may_wait_holding_nothing(state_dir: Path) -> None:
    claims = [claim("c0", "binpack", None, "1Gi"), claim("c1", "binpack", None, "1Gi")]
    members = [member(f"m{i}", f"c{i}", "g", 3, gated=True) for i in range(2)]
    cluster: Any = FakeCluster(state_dir, claims, members)
    assert check_invariants(cluster, settled=True, cdi_dir=state_dir) == []


def test_capacity_held_by_a_waiting_gang_member_is_seen(state_dir: Path) -> None:
    """A predecessor's phase 1 left a member allocated and gated: the capacity must be released."""
    claims = [claim("c0", "binpack", "gpu-0", "1Gi"), claim("c1", "binpack", None, "1Gi")]
    members = [member(f"m{i}", f"c{i}", "g", 3, gated=True) for i in range(2)]
    cluster: Any = FakeCluster(state_dir, claims, members)
    problems = check_invariants(cluster, settled=True, cdi_dir=state_dir)
    assert problems == ["gated pod m0 holds the allocation of claim c0"], problems


def test_a_gang_admitted_in_part_or_waiting_while_it_fits_is_seen(state_dir: Path) -> None:
    """g: one of three members past the gate; h: three members of 4Gi wait while the idle 15Gi
    card takes them all."""
    claims = [claim("g0", "binpack", "gpu-0", "1Gi"), claim("g1", "binpack", None, "1Gi")]
    claims += [
        claim("g2", "binpack", None, "1Gi"),
        *(claim(f"h{i}", "binpack", None, "4Gi") for i in range(3)),
    ]
    pods = [
        member("g0", "g0", "g", 3, running=True),
        member("g1", "g1", "g", 3, gated=True),
        member("g2", "g2", "g", 3, gated=True),
        *(member(f"h{i}", f"h{i}", "h", 3, gated=True) for i in range(3)),
    ]
    cluster: Any = FakeCluster(state_dir, claims, pods)
    (spec,) = [c for c in claims if c["metadata"]["name"] == "g0"]
    (state_dir / CdiNames(DRIVER).spec_file_name(spec["metadata"]["uid"])).write_text("{}")
    problems = check_invariants(cluster, settled=True, cdi_dir=state_dir)
    assert problems == [
        "gang g: 1 member(s) past the gate, needs 3, ['g1', 'g2'] wait",
        "gang h held at the gate while its members ['h0', 'h1', 'h2'] fit together",
    ], problems


def test_a_gang_that_does_not_fit_together_may_wait(state_dir: Path) -> None:
    """Two mutex members and one of 8Gi on two idle cards: each fits alone, and all of them only
    if the controller plans the mutex members first (the check must not count on an order)."""
    claims = [claim("a", "mutex", None, "1Gi"), claim("b", "mutex", None, "1Gi"), claim("c", "binpack", None)]
    pods = [member(n, n, "g", 3, gated=True) for n in ("a", "b", "c")]
    cluster: Any = FakeCluster(state_dir, claims, pods)
    assert check_invariants(cluster, settled=True, cdi_dir=state_dir) == []


def test_a_gang_of_slices_that_would_not_fit_in_every_order_may_wait(state_dir: Path) -> None:
    """Members of 6Gi, 4Gi and 10Gi on two cards with 10Gi free each: first-fit decreasing places
    them, but spread in the members' order (6Gi, then 4Gi on the other card) leaves no card for
    the third; the controller may wait."""
    claims = [claim("used0", "binpack", "gpu-0", "5Gi"), claim("used1", "binpack", "gpu-1", "5Gi")]
    claims += [claim(f"h{i}", "spread", None, f"{gib}Gi") for i, gib in enumerate((6, 4, 10))]
    pods = [member(f"h{i}", f"h{i}", "h", 3, gated=True) for i in range(3)]
    cluster: Any = FakeCluster(state_dir, claims, pods)
    assert check_invariants(cluster, settled=True, cdi_dir=state_dir) == []
