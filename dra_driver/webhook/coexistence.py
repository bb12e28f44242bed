"""Start-up warnings when something else also serves HAMi's ``nvidia.com/gpu``.

Translation rewrites a pod before anything else sees it, so in an opted-in namespace our driver
always wins: the pod no longer asks for ``nvidia.com/gpu``, so neither a device plugin (HAMi's or
NVIDIA's) nor a DeviceClass with ``extendedResourceName: nvidia.com/gpu`` (kube-scheduler's
extended-resource mapping) is involved. Outside those namespaces they keep serving the pods. The
admin should know both are installed, so the webhook says so once at start-up.
"""

from __future__ import annotations

import logging

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.kube.api import DEVICE_CLASSES, NODES, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.resource.nodes import NodeView
from dra_driver.resource.objects import DeviceClassView
from dra_driver.webhook.hami_resources import GPU, NAMESPACE_LABEL, NAMESPACE_LABEL_VALUE

log = logging.getLogger(__name__)


def coexistence_warnings(kube: Kube) -> list[str]:
    """What else serves ``nvidia.com/gpu`` in this cluster, one sentence each."""
    switch = (
        f"in namespaces labelled {NAMESPACE_LABEL}={NAMESPACE_LABEL_VALUE} hami-dra translates the pods and "
        f"wins; remove the label to hand a namespace back"
    )
    warnings = []
    try:
        nodes = [NodeView.parse(item) for item in kube.list(NODES).get("items") or ()]
        plugin_nodes = sorted(node.name for node in nodes if GPU in node.allocatable)
        if plugin_nodes:
            shown = ", ".join(plugin_nodes[:5]) + (" ..." if len(plugin_nodes) > 5 else "")
            warnings.append(
                f"a device plugin advertises {GPU} on {len(plugin_nodes)} node(s) ({shown}); {switch}"
            )
        # Whether a class is ours does not matter here: any class mapping the name is reported.
        classes = [
            DeviceClassView(item, DEFAULT_DRIVER_NAME)
            for item in kube.list(DEVICE_CLASSES).get("items") or ()
        ]
        mapped = sorted(c.name for c in classes if c.extended_resource_name == GPU)
        if mapped:
            warnings.append(f"DeviceClass {', '.join(mapped)} maps the extended resource {GPU}; {switch}")
    except KubeError as err:
        warnings.append(f"could not check what else serves {GPU} (nodes, DeviceClasses): {err}")
    return warnings


def warn_about_coexistence(kube: Kube) -> None:
    for warning in coexistence_warnings(kube):
        log.warning("%s", warning)
