"""``top`` with a card in MIG mode (issue 37): each instance a row naming its profile and card, and
one line per MIG card with its instances in use and who holds each."""

from __future__ import annotations

import json
from typing import Any

from dra_driver.top.objects import parse_claim, parse_pod, parse_slices
from dra_driver.top.render import render_json, render_table
from dra_driver.top.report import TopReport, build_report
from tests.controller.mig_world import mig_slices
from tests.top.builders import DRIVER, pod


def mig_claim(namespace: str, name: str, device: str, pod_name: str) -> dict[str, Any]:
    """A claim allocated one MIG instance whole (no shareID), as our controller writes it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": f"mig.{DRIVER}"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "mig", "driver": DRIVER, "pool": "n1", "device": device}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}],
        },
    }


def mig_report(namespace: str | None = None) -> TopReport:
    slices = mig_slices([None, ["3g.71gb", "2g.35gb", "1g.18gb"]])
    claims = [
        mig_claim("team-a", "small", "gpu-1-mig-13-0", "p1"),
        mig_claim("team-b", "big", "gpu-1-mig-1-0", "p2"),
    ]
    pods = [
        pod("team-a", "p1", claims=("small",), phase="Running"),
        pod("team-b", "p2", claims=("big",), phase="Running"),
    ]
    parsed = [c for c in (parse_claim(claim, DRIVER) for claim in claims) if c is not None]
    return build_report(
        parse_slices(slices, DRIVER), parsed, [parse_pod(p) for p in pods], driver=DRIVER, namespace=namespace
    )


def test_instances_are_rows_of_their_own_and_each_mig_card_is_summarised() -> None:
    out = render_table(mig_report())
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("n1 ")}
    assert set(rows) == {"gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-5-0", "gpu-1-mig-13-0"}
    assert "MIG 1g.18gb of gpu-1" in rows["gpu-1-mig-13-0"]
    assert "team-a/p1/small (MIG instance)" in rows["gpu-1-mig-13-0"]
    assert (
        "n1/gpu-1 (MIG): 2/3 instances in use: 3g.71gb team-b/p2/big; 2g.35gb free; 1g.18gb team-a/p1/small"
        in out
    )


def test_a_namespace_scope_counts_the_other_namespaces_instances() -> None:
    out = render_table(mig_report(namespace="team-a"))
    assert "n1/gpu-1 (MIG): 2/3 instances in use: 3g.71gb +1 of other namespaces; 2g.35gb free;" in out


def test_json_names_each_instance_profile_and_card() -> None:
    document = json.loads(render_json(mig_report()))
    devices = {d["device"]: d for node in document["nodes"] for d in node["devices"]}
    assert devices["gpu-1-mig-5-0"]["migProfile"] == "2g.35gb"
    assert devices["gpu-1-mig-5-0"]["migParent"] == "gpu-1"
    assert "migProfile" not in devices["gpu-0"]
    assert devices["gpu-1-mig-1-0"]["memory"] == {"used": 71424 * 1024**2, "total": 71424 * 1024**2}


def test_the_nodes_view_counts_a_mig_card_once_and_its_instances() -> None:
    top = mig_report()
    out = render_table(top, view="nodes")
    (row,) = [line for line in out.splitlines() if line.startswith("n1 ")]
    assert row.split()[1:3] == ["2", "(3"], row  # gpu-0 and the MIG card, with its 3 instances
    (node,) = json.loads(render_json(top))["nodes"]
    assert (node["gpus"], node["migInstances"]) == (2, 3)


def on_demand_report() -> tuple[TopReport, str]:
    """Two H200 cards offering MIG on demand; team-a holds a 1g at slice 0 of gpu-0."""
    from tests.controller.test_mig_on_demand_flow import on_demand_slices

    slices = on_demand_slices(cards=2)
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    placements = [name for name in names if name.startswith("gpu-0-mig-1g")]
    first = min(placements, key=lambda name: int(name.rsplit("-", 1)[1]))
    claims = [mig_claim("team-a", "small", first, "p1")]
    for body in claims:
        body["status"]["allocation"]["devices"]["results"][0]["pool"] = slices[0]["spec"]["pool"]["name"]
    pods = [pod("team-a", "p1", claims=("small",), phase="Running")]
    parsed = [c for c in (parse_claim(claim, DRIVER) for claim in claims) if c is not None]
    top = build_report(parse_slices(slices, DRIVER), parsed, [parse_pod(p) for p in pods], driver=DRIVER)
    return top, first


def test_mig_on_demand_lists_only_allocated_placements_and_counts_each_card_once() -> None:
    top, first = on_demand_report()
    (node,) = top.nodes
    # one instance made: the other 17 placements of gpu-0 and gpu-1's 18 are no devices
    assert [(card.device, card.mig_on_demand) for card in node.cards] == [(first, True)]
    assert node.gpus == 2 and node.mig_instances == 1
    card_memory = max(c.memory for c in node.on_demand)
    assert node.memory.total == 2 * card_memory  # each card once, not every placement summed
    assert node.memory.used == node.cards[0].memory.used > 0
    lines = [line for line in render_table(top).splitlines() if "(MIG on demand)" in line]
    assert len(lines) == 2
    assert lines[0].startswith(f"{node.name}/gpu-0 (MIG on demand): 1 instances made of ")
    assert "team-a/p1/small" in lines[0]
    assert lines[1] == f"{node.name}/gpu-1 (MIG on demand): 0 instances made of 18 placements offered"
    (doc_node,) = json.loads(render_json(top))["nodes"]
    assert doc_node["migInstances"] == 1
    assert [c["device"] for c in doc_node["migOnDemand"]] == ["gpu-0", "gpu-1"]
