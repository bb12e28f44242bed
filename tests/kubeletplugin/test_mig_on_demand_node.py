"""A node with a card in MIG on demand, end to end in-process (issue 37 item 2): the plugin publishes
the card's placements with their counters, kubelet's gRPC prepare creates the instance at the
allocated placement (CDI: the card's node and the instance's two capabilities), unprepare destroys
it, and a plugin restarted after dying between create and record destroys the orphan first.

Simulated card (``migEnabled: true``): the instances live in the plugin's ``simulated-mig.json``,
which outlives the plugin as the kernel driver's state does; the NVML path is tested process by
process on the mock NVML (tests/devices/test_mig_on_demand_nvml.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dra_driver.devices.mig import mig_caps_minors
from dra_driver.devices.mig_on_demand import mark_on_demand, parse_selection
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.kubeletplugin.metrics import MIG_INSTANCE_MEMORY
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.kubelet import KubeletProtocol
from tests.kubeletplugin.conftest import NODE, Dirs, create_claim, plugin_options, ref, registered_kubelet
from tests.kubeletplugin.helpers import DRIVER, claim, read_spec, result, validate_cdi
from tests.kubeletplugin.test_mig_node import published_devices
from tests.waiting import wait_for

PLACEMENT = "gpu-1-mig-1g18gb-at-3"


def on_demand_gpus(directory: Path) -> list:
    path = directory / "devices.yaml"
    gpus = [{"index": 0, "profile": "h200"}, {"index": 1, "profile": "h200", "migEnabled": True}]
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return mark_on_demand(DevicesFileSource(path, node_name=NODE).discover(), parse_selection("1"))


def simulated_instances(dirs: Dirs) -> list[tuple[int, int]]:
    path = dirs.plugin / "simulated-mig.json"
    data: dict[str, list[dict[str, Any]]] = json.loads(path.read_text()) if path.exists() else {}
    return sorted((i["start"], i["size"]) for items in data.values() for i in items)


def test_placements_are_published_and_prepare_creates_the_instance(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    options = plugin_options(dirs, publish=True, mig_on_demand=frozenset({"1"}))
    plugin = KubeletPlugin(options, on_demand_gpus(dirs.root), api_client)
    plugin.start()
    try:

        def placements() -> list[str] | None:
            names = sorted(d["name"] for d in published_devices(api_client))
            return names if PLACEMENT in names else None

        names = wait_for(placements, 30, "the placements' slices")
        assert "gpu-0" in names and PLACEMENT in names and "gpu-1" not in names
        assert len([n for n in names if n.startswith("gpu-1-mig-")]) == 18
        with registered_kubelet(plugin, protocol) as kubelet:
            first = create_claim(api_client, claim("slice", [result(PLACEMENT, share=False)]), "p1")
            uid = first["metadata"]["uid"]
            assert kubelet.prepare([ref(first)]).claims[uid].error == ""
            assert simulated_instances(dirs) == [(3, 1)]
            # The instance has its series, with the UUID only the plugin knows.
            instance = plugin.mig.records()[PLACEMENT] if plugin.mig is not None else None
            assert instance is not None and instance.uuid.startswith("MIG-")
            series = {"node": NODE, "device": PLACEMENT, "profile": "1g.18gb", "parent": "gpu-1"}
            memory = plugin.metrics.registry.get_sample_value(
                MIG_INSTANCE_MEMORY, {**series, "uuid": instance.uuid}
            )
            assert memory == 16896 * 1024**2
            spec = read_spec(dirs.cdi / f"k8s.{DRIVER}-gpu_{uid}.json")
            validate_cdi(spec)
            (device,) = spec["devices"]
            caps = [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in mig_caps_minors(1, 10, 0)]
            assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia1", *caps]
            # An overlapping placement for another claim: the driver refuses, nothing is left behind.
            other = create_claim(
                api_client, claim("big", [result("gpu-1-mig-3g71gb-at-0", share=False)]), "p2"
            )
            error = kubelet.prepare([ref(other)]).claims[other["metadata"]["uid"]].error
            assert "could not be created" in error and "overlaps an instance" in error
            assert simulated_instances(dirs) == [(3, 1)]
            assert kubelet.unprepare([ref(first)]).claims[uid].error == ""
            assert simulated_instances(dirs) == []
            assert plugin.mig is not None and plugin.mig.records() == {}
            assert (
                plugin.metrics.registry.get_sample_value(
                    MIG_INSTANCE_MEMORY, {**series, "uuid": instance.uuid}
                )
                is None
            )
    finally:
        plugin.stop()


def test_a_restart_destroys_an_instance_created_but_not_recorded(dirs: Dirs, api_client: Any) -> None:
    """The state a plugin killed at the ``mig-after-create`` failpoint leaves (the kill itself is
    tested on the mock NVML): the intent is on disk, the instance exists, nobody was answered."""
    gpus = on_demand_gpus(dirs.root)
    options = plugin_options(dirs, publish=False, mig_on_demand=frozenset({"1"}))
    first = KubeletPlugin(options, gpus, api_client)
    assert first.mig is not None
    card = gpus[1]
    first.mig.driver.create(card.uuid, 9, 3, 4, 4)  # 3g.71gb at slice 4, as NVML would have it
    intent = {
        "claim": "c-1",
        "parent_uuid": card.uuid,
        "profile_id": 9,
        "slices": 3,
        "start": 4,
        "size": 4,
        "state": "creating",
    }
    (dirs.plugin / "mig-on-demand.json").write_text(
        json.dumps({"instances": {"gpu-1-mig-3g71gb-at-4": intent}})
    )
    first.mig.driver.create(card.uuid, 19, 1, 0, 1)  # an admin's 1g at slice 0: not ours
    restarted = KubeletPlugin(options, gpus, api_client)
    restarted.start()
    try:
        assert simulated_instances(dirs) == [(0, 1)]  # the orphan is gone, the admin's kept
        assert restarted.mig is not None and restarted.mig.records() == {}
        published = {m.uuid for m in restarted._current_gpus()[1].mig_devices}
        assert len(published) == 1  # the admin's instance: its slice is not offered
    finally:
        restarted.stop()
