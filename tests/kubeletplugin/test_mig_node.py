"""A node with a card in MIG mode, end to end in-process: the plugin publishes the card's MIG devices
(never the card) to the API server, and kubelet's gRPC prepares one MIG device whole, with
its card's node and its two capabilities; a second claim on the same MIG device is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from dra_driver.devices.mig import mig_caps_minors
from dra_driver.devices.simulated import DevicesFileSource
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.kubelet import KubeletProtocol
from tests.kubeletplugin.conftest import NODE, Dirs, create_claim, plugin_options, ref, registered_kubelet
from tests.kubeletplugin.helpers import DRIVER, claim, read_spec, result, validate_cdi
from tests.waiting import wait_for


def mig_gpus(directory: Path) -> list:
    path = directory / "devices.yaml"
    gpus = [
        {"index": 0, "profile": "a100-80gb"},
        {"index": 1, "profile": "a100-80gb", "migDevices": ["4g.40gb", "3g.40gb"]},
    ]
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return DevicesFileSource(path, node_name=NODE).discover()


def published_devices(api_client: Any) -> list[dict[str, Any]]:
    listed = k8s.ResourceV1Api(api_client).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}", _preload_content=False
    )
    items = json.loads(listed.data)["items"]
    return [d for s in items if s["spec"]["driver"] == DRIVER for d in s["spec"].get("devices") or []]


def test_a_mig_card_is_published_as_its_mig_devices_and_one_is_prepared_whole(
    dirs: Dirs, api_client: Any, protocol: KubeletProtocol
) -> None:
    plugin = KubeletPlugin(
        plugin_options(dirs, publish=True, policy_taint=True), mig_gpus(dirs.root), api_client
    )
    plugin.start()
    try:
        names = wait_for(
            lambda: sorted(d["name"] for d in published_devices(api_client)) or None, 30, "the node's slice"
        )
        assert names == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-2-0"]
        mig = next(d for d in published_devices(api_client) if d["name"] == "gpu-1-mig-2-0")
        assert mig["attributes"]["profile"] == {"string": "3g.40gb"} and "taints" not in mig
        with registered_kubelet(plugin, protocol) as kubelet:
            first = create_claim(api_client, claim("mig", [result("gpu-1-mig-2-0", share=False)]), "p1")
            response = kubelet.prepare([ref(first)])
            uid = first["metadata"]["uid"]
            assert response.claims[uid].error == ""
            spec = read_spec(dirs.cdi / f"k8s.{DRIVER}-gpu_{uid}.json")
            validate_cdi(spec)
            (device,) = spec["devices"]
            assert device["containerEdits"]["deviceNodes"] == [
                {"path": "/dev/nvidia1", "hostPath": "/dev/null"},
                {"path": "/dev/nvidia-caps/nvidia-cap156", "hostPath": "/dev/null"},  # gpu1/gi2/access
                {"path": "/dev/nvidia-caps/nvidia-cap157", "hostPath": "/dev/null"},  # gpu1/gi2/ci0/access
            ]
            second = create_claim(api_client, claim("again", [result("gpu-1-mig-2-0", share=False)]), "p2")
            refused = kubelet.prepare([ref(second)]).claims[second["metadata"]["uid"]].error
            assert "gpu-1-mig-2-0 is allocated exclusively" in refused
            card = create_claim(api_client, claim("card", [result("gpu-1", share=False)]), "p3")
            error = kubelet.prepare([ref(card)]).claims[card["metadata"]["uid"]].error
            assert "gpu-1 does not exist on this node" in error
            assert kubelet.unprepare([ref(first)]).claims[uid].error == ""
            # As our controller allocates the chart's MIG class: whole, with the class's GpuConfig.
            placed = claim("placed", [result("gpu-1-mig-1-0", share=False)])
            parameters = {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "policy": "binpack"}
            placed["status"]["allocation"]["devices"]["config"] = [
                {
                    "source": "FromClass",
                    "requests": ["gpu"],
                    "opaque": {"driver": DRIVER, "parameters": parameters},
                }
            ]
            placed = create_claim(api_client, placed, "p4")
            assert kubelet.prepare([ref(placed)]).claims[placed["metadata"]["uid"]].error == ""
            spec = read_spec(dirs.cdi / f"k8s.{DRIVER}-gpu_{placed['metadata']['uid']}.json")
            (device,) = spec["devices"]
            caps = [f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in mig_caps_minors(1, 1, 0)]
            assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia1", *caps]
    finally:
        plugin.stop()
