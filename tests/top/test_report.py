"""``top``'s pure part: API objects (made by the plugin's and the controller's own writers) in,
rows and JSON out. Each test names the rule it pins; the lab is described in ``builders.py``."""

from __future__ import annotations

import json

import pytest
import yaml

from dra_driver.kube.api import Obj
from dra_driver.quantity import GIB, MIB
from dra_driver.top.objects import (
    AWAITING_CONTROLLER,
    ISOLATION_UNKNOWN,
    parse_claim,
    parse_pod,
    parse_slices,
)
from dra_driver.top.render import bar, render_json, render_table, short_bytes
from dra_driver.top.report import Card, TopReport, Usage, build_report
from tests.api_objects import allocated_claim
from tests.top.builders import (
    DRIVER,
    T4_MEMORY,
    UNSCHEDULABLE_MESSAGE,
    lab_claims,
    lab_pods,
    lab_slices,
)


def report(
    namespace: str | None = None,
    slices: list[Obj] | None = None,
    claims: list[Obj] | None = None,
    pods: list[Obj] | None = None,
    usage_namespace: str | None = None,
) -> TopReport:
    parsed = [parse_claim(c, DRIVER) for c in (lab_claims() if claims is None else claims)]
    return build_report(
        parse_slices(lab_slices() if slices is None else slices, DRIVER),
        [c for c in parsed if c is not None],
        [parse_pod(p) for p in (lab_pods() if pods is None else pods)],
        driver=DRIVER,
        namespace=namespace,
        usage_namespace=usage_namespace,
    )


def card(top: TopReport, node: str, device: str) -> Card:
    return next(c for c in top.cards if c.node == node and c.device == device)


def test_two_tenants_share_one_card_and_their_usage_adds_up() -> None:
    shared = card(report(), "node-1", "gpu-0")
    assert [t.label for t in shared.tenants] == ["team-a/train-0/train", "team-b/infer-0/infer"]
    assert shared.memory == Usage(5 * GIB + 2 * GIB + 512 * MIB, T4_MEMORY)
    assert shared.cores == Usage(40, 100)
    assert shared.slots == Usage(2, 10)
    assert shared.isolation == "hami-core"
    # infer-0 is still gated (allocated, not reserved yet): found through the claim's owner.
    infer = shared.tenants[1]
    assert infer.pods == ("infer-0",) and infer.starting and infer.share_id


def test_a_result_without_share_id_takes_the_whole_card() -> None:
    whole = card(report(), "node-1", "gpu-1")
    assert whole.memory == Usage(T4_MEMORY, T4_MEMORY)
    assert whole.cores == Usage(100, 100)
    assert whole.slots == Usage(10, 10)
    (tenant,) = whole.tenants
    assert tenant.whole_card and tenant.share_id is None and tenant.memory == T4_MEMORY


def test_a_share_without_consumed_capacity_takes_one_slot_as_in_the_ledger() -> None:
    # kube-scheduler adds a share's consumedCapacity, nothing when there is none; the ledger (and
    # so the controller) counts it as one tenant: top shows what they count, not a whole card.
    raw = allocated_claim("team-a", "odd", "node-1", [(3, GIB, 10)])
    del raw["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    odd = card(report(claims=[raw]), "node-1", "gpu-3")
    assert (odd.memory, odd.cores, odd.slots) == (Usage(0, T4_MEMORY), Usage(0, 100), Usage(1, 10))
    (tenant,) = odd.tenants
    assert not tenant.whole_card and tenant.share_id


def test_admin_access_is_listed_but_not_counted() -> None:
    raw = allocated_claim("monitoring", "probe", "node-1", [(3, GIB, 10)])
    result = raw["status"]["allocation"]["devices"]["results"][0]
    del result["shareID"], result["consumedCapacity"]
    result["adminAccess"] = True
    watched = card(report(claims=[raw]), "node-1", "gpu-3")
    assert watched.memory.used == 0 and watched.tenants[0].admin_access


def test_an_unhealthy_tainted_card_and_isolation_values() -> None:
    top = report()
    sick = card(top, "node-1", "gpu-2")
    assert sick.health == "unhealthy" and sick.unhealthy_taint and sick.healthy is False
    assert [t.key for t in sick.taints] == ["gpu.hami.io/unhealthy"]
    assert card(top, "node-1", "gpu-3").isolation == "none"
    # node-2's plugin publishes no isolation attribute: unknown, not guessed.
    assert card(top, "node-2", "gpu-0").isolation == ISOLATION_UNKNOWN
    table = render_table(top)
    assert "unhealthy (tainted)" in table
    assert [n.healthy_cards for n in top.nodes] == [3, 2]


def test_a_card_nothing_watches_reads_not_monitored() -> None:
    top = report()
    unwatched = card(top, "node-1", "gpu-1")
    assert unwatched.health == "healthy" and unwatched.health_monitored is False
    assert card(top, "node-2", "gpu-0").health_monitored is None  # not published: not guessed
    assert "healthy (not monitored)" in render_table(top)
    devices = json.loads(render_json(top))["nodes"][0]["devices"]
    assert [d["healthMonitored"] for d in devices] == [None, False, None, None]


def test_pending_pods_are_grouped_by_the_controllers_reason() -> None:
    groups = report().pending
    assert [(g.reason, [p.name for p in g.pods]) for g in groups] == [
        ("Unschedulable", ["big-0", "big-1"]),
        (AWAITING_CONTROLLER, ["fresh"]),
        ("GpuQuotaExceeded", ["over"]),
    ]
    assert groups[0].pods[0].message == UNSCHEDULABLE_MESSAGE


def test_namespace_scope_lists_its_tenants_but_counts_the_whole_card() -> None:
    # Issue 39: "a card with 7.5Gi used read 5Gi/15Gi" under -n: the used figure is the card's.
    everything, team_a = report(), report("team-a")
    assert card(everything, "node-1", "gpu-0").memory.used == 7 * GIB + 512 * MIB
    scoped = card(team_a, "node-1", "gpu-0")
    assert [t.label for t in scoped.tenants] == ["team-a/train-0/train"]
    assert scoped.other_tenants == 1
    assert scoped.memory == card(everything, "node-1", "gpu-0").memory
    assert (scoped.cores, scoped.slots) == (Usage(40, 100), Usage(2, 10))
    assert [n.memory for n in team_a.nodes] == [n.memory for n in everything.nodes]
    assert [g.reason for g in team_a.pending] == ["Unschedulable"]
    table = render_table(team_a)
    first, second = table.splitlines()[1:3]
    assert "[#####.....] 7.5Gi/14.6Gi" in first and "team-a/train-0/train (5Gi 30%)" in first
    assert second.strip() == "+1 of other namespaces" and "team-b/" not in table
    assert "Tenants and pending pods of namespace team-a only (usage counts every namespace)" in table
    assert "-A for all" not in render_table(everything)
    document = json.loads(render_json(team_a))
    assert document["usageNamespace"] is None and document["namespace"] == "team-a"
    assert document["nodes"][0]["devices"][0]["otherTenants"] == 1


def test_without_the_other_namespaces_claims_usage_is_the_namespaces_share_and_says_so() -> None:
    # A tenant's Role cannot list every namespace's claims: top gets only its own and is told so.
    own = [c for c in lab_claims() if c["metadata"]["namespace"] == "team-a"]
    team_a = report("team-a", claims=own, usage_namespace="team-a")
    scoped = card(team_a, "node-1", "gpu-0")
    assert scoped.memory.used == 5 * GIB and scoped.other_tenants == 0
    assert "Usage and tenants of namespace team-a only (claims of all namespaces cannot be listed" in (
        render_table(team_a)
    )
    assert json.loads(render_json(team_a))["usageNamespace"] == "team-a"


def test_gpus_table_has_a_line_per_card_and_a_continuation_per_extra_tenant() -> None:
    lines = render_table(report()).splitlines()
    assert lines[0].split() == [
        "NODE", "DEVICE", "PRODUCT", "ISOLATION", "HEALTH", "MEMORY", "CORES", "SLOTS", "TENANTS",
    ]  # fmt: skip
    assert "[#####.....] 7.5Gi/14.6Gi" in lines[1] and "team-a/train-0/train (5Gi 30%)" in lines[1]
    assert lines[2].strip() == "team-b/infer-0/infer (2.5Gi 10%)"
    assert "[##########] 14.6Gi/14.6Gi" in lines[3] and "(whole card)" in lines[3]
    assert "Unschedulable        2         team-a/big-0, team-a/big-1" in lines


def test_nodes_table_has_one_line_per_node() -> None:
    lines = render_table(report(), "nodes").splitlines()
    assert lines[0].split() == ["NODE", "GPUS", "HEALTHY", "MEMORY", "CORES", "SLOTS", "TENANTS", "STARTING"]
    assert lines[1].split() == [
        "node-1", "4", "3/4", "[####......]", "22.1Gi/58.5Gi", "[####......]", "140/400", "12/40", "3", "1",
    ]  # fmt: skip
    assert lines[2].split()[:5] == ["node-2", "2", "2/2", "[#.........]", "1Gi/29.2Gi"]
    assert lines[3] == ""


def test_wide_adds_uuids_and_pending_messages() -> None:
    top = report()
    table = render_table(top, wide=True)
    assert card(top, "node-1", "gpu-0").uuid in table
    assert f"team-a/big-0   {UNSCHEDULABLE_MESSAGE}" in table


def test_json_is_the_documented_structure() -> None:
    document = json.loads(render_json(report()))
    assert set(document) == {"driver", "namespace", "usageNamespace", "nodes", "pending", "unpublished"}
    assert document["namespace"] is None
    node = document["nodes"][0]
    assert set(node) == {
        "name", "gpus", "healthyGpus", "memory", "cores", "slots", "tenants", "starting", "devices",
    }  # fmt: skip
    device = node["devices"][0]
    assert set(device) == {
        "pool", "device", "index", "uuid", "productName", "isolation", "health", "healthyAttribute",
        "unhealthyTaint", "healthMonitored", "taints", "memory", "cores", "slots", "tenants",
        "otherTenants",
    }  # fmt: skip
    assert device["memory"] == {"used": 7 * GIB + 512 * MIB, "total": T4_MEMORY}
    tenant = device["tenants"][0]
    assert {k: v for k, v in tenant.items() if k != "shareID"} == {
        "namespace": "team-a", "claim": "train", "pods": ["train-0"], "request": "gpu",
        "wholeCard": False, "adminAccess": False, "memory": 5 * GIB, "cores": 30, "slots": 1,
        "starting": False,
    }  # fmt: skip
    assert document["pending"][0] == {
        "reason": "Unschedulable",
        "count": 2,
        "pods": [
            {"namespace": "team-a", "name": n, "gated": True, "message": UNSCHEDULABLE_MESSAGE}
            for n in ("big-0", "big-1")
        ],
    }


def test_yaml_is_the_json_document() -> None:
    top = report()
    assert yaml.safe_load(render_json(top, "yaml")) == json.loads(render_json(top))


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    slices = lab_slices()
    stale = json.loads(json.dumps(slices[0]))
    stale["metadata"]["name"] = "stale"
    stale["spec"]["pool"]["generation"] = 0
    stale["spec"]["devices"] = [{**stale["spec"]["devices"][0], "name": "gpu-9"}]
    top = report(slices=[stale, *slices])
    assert [c.device for c in top.nodes[0].cards] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_an_allocation_on_an_unpublished_device_is_reported() -> None:
    top = report(claims=[allocated_claim("team-a", "ghost", "node-9", [(0, GIB, 0)])])
    assert [(u.pool, u.device, u.tenant.claim) for u in top.unpublished] == [("node-9", "gpu-0", "ghost")]
    assert "node-9/gpu-0, which no slice publishes" in render_table(top)


def test_other_drivers_and_no_slices() -> None:
    top = report(slices=[], claims=[], pods=[])
    assert top.nodes == () and "No GPUs: no ResourceSlice of driver gpu.hami.io" in render_table(top)
    assert parse_slices(lab_slices(), "other.example.com") == []
    assert all(parse_claim(c, "other.example.com") is None for c in lab_claims())


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (Usage(0, 100), "[..........]"),
        (Usage(1, 1000), "[#.........]"),  # anything used shows
        (Usage(50, 100), "[#####.....]"),
        (Usage(100, 100), "[##########]"),
        (Usage(150, 100), "[!!!!!!!!!!]"),  # overcommitted
        (Usage(0, 0), "[..........]"),
    ],
)
def test_bar(usage: Usage, expected: str) -> None:
    assert bar(usage) == expected


def test_short_bytes() -> None:
    assert [short_bytes(v) for v in (0, 512 * MIB, 15 * GIB, 7 * GIB + 512 * MIB, 81559 * MIB)] == [
        "0", "512Mi", "15Gi", "7.5Gi", "79.6Gi",
    ]  # fmt: skip
