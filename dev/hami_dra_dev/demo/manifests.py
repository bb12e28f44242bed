"""The demo's Kubernetes objects: the worked example's lab (one node, four Tesla T4) and its pods, in order.

The worked example needs GPU 0 with two 1000 MiB tenants, GPU 1 with one, GPUs 2 and 3
idle, then a ``mutex,binpack`` pod. On an idle node ``binpack`` ties everywhere and takes GPU 0,
then stacks the second tenant there; ``spread`` then takes the least used card, GPU 1. So the
tenants are created through ordinary policy classes, exactly as a user would, and the placements
themselves are part of what the demo checks. A ``spread`` filler then takes GPU 3 so that a
``mutex`` pod finds no idle card and stays Pending until the filler is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.hami.io"
NODE = "gke-lab-node"
NAMESPACE = "default"
PROFILE = "t4"
GPU_COUNT = 4
TENANT_MEMORY = "1000Mi"
GATE = f"{DRIVER}/allocation"  # added by the webhook, removed by the controller

#: DeviceClass name -> GpuConfig policy chain carried as the class's opaque parameters.
CLASS_POLICIES: dict[str, str] = {
    "binpack": "binpack",
    "spread": "spread",
    "mutex-binpack": "mutex,binpack",
    "mutex": "mutex",
}


@dataclass(frozen=True)
class DemoPod:
    """One pod of the scenario and the card the worked example sends it to."""

    name: str
    recipe: str  # key of CLASS_POLICIES
    expected_device: str
    why: str

    @property
    def policy(self) -> str:
        return CLASS_POLICIES[self.recipe]


TENANTS = (
    DemoPod("tenant-a", "binpack", "gpu-0", "idle node: binpack ties at 0, lowest index wins"),
    DemoPod("tenant-b", "binpack", "gpu-0", "binpack stacks onto the busiest card that fits"),
    DemoPod("tenant-c", "spread", "gpu-1", "spread takes the least used card (GPU 1..3 tie, index wins)"),
)
LATENCY = DemoPod(
    "latency-tier", "mutex-binpack", "gpu-2", "mutex drops GPU 0 and 1, binpack ties 2 and 3, index wins"
)
FILLER = DemoPod("filler", "spread", "gpu-3", "spread takes the only card without tenants")
EXCLUSIVE = DemoPod("exclusive", "mutex", "gpu-3", "mutex waits for a card without tenants")

MISSPELLED_POLICY = "mutex,binpak"

#: The worked example's usage scores of GPU 0..3 when the latency-tier pod is placed. HAMi's own
#: example counts a T4's 15360 MiB total (3.302083 / 1.651042); the lab's T4s publish what a tenant
#: can get, the total minus the driver's 393 MiB reservation, as NVIDIA's driver does.
EXPECTED_SCORES = (3.336273, 1.668137, 0.0, 0.0)
#: What each lab T4 publishes (``nvidia-smi``: 15360 MiB total, 393 MiB reserved).
T4_MIB = 15360 - 393


def class_name(recipe: str) -> str:
    return f"{recipe}.{DRIVER}"


def template_name(recipe: str) -> str:
    return f"{recipe}-1000mi"


def device_class(recipe: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": class_name(recipe)},
        "spec": {
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
            "config": [
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": f"{DRIVER}/v1alpha1",
                            "kind": "GpuConfig",
                            "policy": CLASS_POLICIES[recipe],
                            "nodePolicy": "binpack",
                        },
                    }
                }
            ],
        },
    }


def misspelled_class() -> dict[str, Any]:
    """A class whose chain names an unknown policy: the validating webhook must reject it."""
    body = device_class("binpack")
    body["metadata"]["name"] = class_name("typo")
    body["spec"]["config"][0]["opaque"]["parameters"]["policy"] = MISSPELLED_POLICY
    return body


def claim_template(recipe: str) -> dict[str, Any]:
    """One GPU with a 1000 MiB memory slice from the recipe's class."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(recipe), "namespace": NAMESPACE},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": class_name(recipe),
                                "count": 1,
                                "capacity": {"requests": {"memory": TENANT_MEMORY}},
                            },
                        }
                    ]
                }
            }
        },
    }


def pod(demo_pod: DemoPod) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": demo_pod.name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "hami-dra-demo", f"{DRIVER}/recipe": demo_pod.recipe},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name(demo_pod.recipe)}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "env | grep ^CUDA_ ; sleep 86400"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
