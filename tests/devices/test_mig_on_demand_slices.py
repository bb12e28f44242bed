"""MIG on demand, publishing (issue 37 item 2): a marked card's possible placements as devices that
consume its shared counters, in the layout each API server version accepts."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path

import pytest
import yaml
from kube_validate import assert_valid

from dra_driver.devices.mig_on_demand import (
    MigOnDemandError,
    mark_on_demand,
    parse_selection,
    placement_by_name,
    possible_placements,
)
from dra_driver.devices.mig_profiles import MIG_MODELS
from dra_driver.devices.simulated import DevicesFileSource, profile_gpus
from dra_driver.resource.mig_on_demand_slices import LAYOUT_OWN_SLICE, LAYOUT_SAME_SLICE, layout_for
from dra_driver.resource.slice_builder import build_resource_slices

H100 = MIG_MODELS["NVIDIA H100 80GB HBM3"]
H200 = MIG_MODELS["NVIDIA H200"]


def mig_cards(
    tmp_path: Path, profile: str = "h100-80gb", gpus: int = 2, mig: list[str] | None = None
) -> list:
    entries: list[dict] = [{"index": i, "profile": profile, "numaNode": i % 2} for i in range(gpus)]
    for entry in entries:
        entry["migDevices"] = list(mig or [])
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump({"gpus": entries}))
    cards = DevicesFileSource(path, node_name="node-1").discover()
    # A devices file without instances gives a card not in MIG mode: switch it on as the admin would.
    return [dataclasses.replace(c, mig_enabled=True) for c in cards]


def test_possible_placements_are_nvmls_table_without_media_extensions() -> None:
    placements = possible_placements(H100)
    by_profile = Counter(p.profile.name for p in placements)
    assert by_profile == {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
    assert [(p.profile.name, p.start) for p in placements[:3]] == [
        ("7g.80gb", 0),
        ("4g.40gb", 0),
        ("3g.40gb", 0),
    ]
    h200 = Counter(p.profile.name for p in possible_placements(H200))
    assert h200["1g.18gb"] == 7 and h200["7g.141gb"] == 1 and not any(n.endswith("+me") for n in h200)
    # An instance the driver did not create at slices 4-7 leaves only what fits below it.
    left = possible_placements(H100, [range(4, 8)])
    assert {(p.profile.name, p.start) for p in left} >= {("4g.40gb", 0), ("3g.40gb", 0), ("1g.10gb", 3)}
    assert all(max(p.span) < 4 for p in left)


def test_selection_flag() -> None:
    assert parse_selection("") == frozenset()
    assert parse_selection("all") == {"all"}
    assert parse_selection(" 0, GPU-abc ") == {"0", "GPU-abc"}
    with pytest.raises(MigOnDemandError, match="neither 'all', a card index"):
        parse_selection("gpu0")
    with pytest.raises(MigOnDemandError, match="cannot be combined"):
        parse_selection("all,1")


def test_marking_needs_mig_mode(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    whole = profile_gpus("h100-80gb", node_name="node-1", gpus=2)
    cards = mig_cards(tmp_path)
    with caplog.at_level(logging.WARNING):
        marked = mark_on_demand([whole[0], cards[1]], parse_selection("all"))
    assert [g.mig_on_demand for g in marked] == [False, True]
    assert "MIG mode is off: published as a whole card" in caplog.text and "-mig 1" in caplog.text
    assert [g.mig_on_demand for g in mark_on_demand(cards, parse_selection("1"))] == [False, True]
    assert [g.mig_on_demand for g in mark_on_demand(cards, parse_selection(cards[0].uuid))] == [True, False]


def on_demand_slices(cards: list, layout: str | None) -> list[dict]:
    return build_resource_slices(
        mark_on_demand(cards, parse_selection("all")), node_name="node-1", mig_on_demand_layout=layout
    )


@pytest.mark.parametrize(
    ("layout", "versions"), [(LAYOUT_SAME_SLICE, ("1.34",)), (LAYOUT_OWN_SLICE, ("1.37",))]
)
def test_placements_consume_the_cards_counters(
    tmp_path: Path, layout: str, versions: tuple[str, ...]
) -> None:
    cards = mig_cards(tmp_path, gpus=4)
    slices = on_demand_slices(cards, layout)
    for slice_ in slices:
        assert_valid(slice_, versions=versions)
    counter_sets = [cs for s in slices for cs in s["spec"].get("sharedCounters", [])]
    assert [cs["name"] for cs in counter_sets] == ["gpu-0-mig", "gpu-1-mig", "gpu-2-mig", "gpu-3-mig"]
    assert counter_sets[0]["counters"]["compute-slices"] == {"value": "7"}
    assert {k: v["value"] for k, v in counter_sets[0]["counters"].items() if k.startswith("memory")} == {
        f"memory-slice-{i}": "1" for i in range(8)
    }
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    assert len(devices) == 4 * 18
    one = devices["gpu-1-mig-1g10gb-at-3"]
    attrs = one["attributes"]
    assert attrs["type"] == {"string": "mig"} and attrs["onDemand"] == {"bool": True}
    assert attrs["profile"] == {"string": "1g.10gb"} and attrs["placementStart"] == {"int": 3}
    assert attrs["parentUUID"] == {"string": cards[1].uuid} and attrs["parentIndex"] == {"int": 1}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 1} and attrs["gpuInstance"] == {"int": 10}
    assert "uuid" not in attrs  # no instance yet
    assert one["consumesCounters"] == [
        {
            "counterSet": "gpu-1-mig",
            "counters": {"memory-slice-3": {"value": "1"}, "compute-slices": {"value": "1"}},
        }
    ]
    seven = devices["gpu-0-mig-7g80gb-at-0"]["consumesCounters"][0]["counters"]
    assert len(seven) == 9 and seven["compute-slices"] == {"value": "7"}
    assert devices["gpu-0-mig-3g40gb-at-4"]["capacity"]["memory"] == {"value": f"{40448}Mi"}
    # Every slice of the pool says how many there are; a layout's slice limits hold.
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    for slice_ in slices:
        spec = slice_["spec"]
        assert len(spec.get("devices", [])) <= 64
        if layout == LAYOUT_OWN_SLICE:
            assert not (spec.get("devices") and spec.get("sharedCounters"))  # 1.35+: one or the other
            assert len(spec.get("sharedCounters", [])) <= 8
        else:
            assert sum(len(cs["counters"]) for cs in spec.get("sharedCounters", [])) <= 32
            used = {c["counterSet"] for d in spec["devices"] for c in d["consumesCounters"]}
            assert used == {cs["name"] for cs in spec["sharedCounters"]}  # 1.34: sets in the same slice


def test_without_partitionable_devices_a_marked_card_publishes_as_static_mig(tmp_path: Path) -> None:
    cards = mig_cards(tmp_path, gpus=1, mig=["3g.40gb"])
    (slice_,) = on_demand_slices(cards, None)
    assert [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0-mig-1-0"]  # 3g.40gb at 0: GPU instance 1
    assert "sharedCounters" not in slice_["spec"]


def test_foreign_instances_keep_their_slices(tmp_path: Path) -> None:
    """An instance the driver did not create (``mig_devices`` of an on-demand card) is never offered over."""
    cards = mig_cards(tmp_path, gpus=1, mig=["3g.40gb@4"])
    names = {
        d["name"] for s in on_demand_slices(cards, LAYOUT_OWN_SLICE) for d in s["spec"].get("devices", [])
    }
    assert "gpu-0-mig-3g40gb-at-0" in names and "gpu-0-mig-1g10gb-at-3" in names
    assert not {"gpu-0-mig-3g40gb-at-4", "gpu-0-mig-7g80gb-at-0", "gpu-0-mig-1g10gb-at-4"} & names


def test_placement_names_round_trip(tmp_path: Path) -> None:
    (card,) = mig_cards(tmp_path, profile="h200", gpus=1)
    placement = placement_by_name(card, "gpu-0-mig-1g18gb-at-5")
    assert (placement.profile.name, placement.start, placement.gpu_instance) == ("1g.18gb", 5, 12)
    with pytest.raises(MigOnDemandError, match="no such profile and start slot"):
        placement_by_name(card, "gpu-0-mig-3g71gb-at-2")
    with pytest.raises(MigOnDemandError, match="is no MIG placement of gpu-0"):
        placement_by_name(card, "gpu-1-mig-1g18gb-at-5")


def test_layout_follows_the_server_version() -> None:
    assert layout_for(34) == LAYOUT_SAME_SLICE
    assert layout_for(35) == layout_for(37) == LAYOUT_OWN_SLICE


def test_mig_device_model_keeps_static_cards_apart() -> None:
    with pytest.raises(ValueError, match="MIG on demand needs MIG mode"):
        dataclasses.replace(profile_gpus("h100-80gb", node_name="n", gpus=1)[0], mig_on_demand=True)
