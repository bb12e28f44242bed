"""``hami-dra discover``: print the ResourceSlice(s) this node would publish.

Usage::

    # real GPUs (needs the NVIDIA driver; in a container mount /dev/nvidia* and libnvidia-ml.so.1)
    hami-dra discover --source nvml

    # simulated: a named profile and a GPU count, or a devices file
    hami-dra discover --source simulated --profile h100-80gb --gpus 8 --node-name node-1
    hami-dra discover --source simulated --devices-file examples/devices/mixed.yaml --node-name node-1 -o json

Options: ``--source nvml|simulated`` (default: ``simulated`` when ``--profile`` or
``--devices-file`` is given, else ``nvml``; never a silent fallback), ``--profile
t4|a100-80gb|h100-80gb|h200``, ``--gpus N``, ``--devices-file F`` (YAML/JSON), ``--node-name``
(default ``$NODE_NAME``, else for ``nvml`` this host's name, lower-cased, as kubelet names its
node), ``--driver-name`` (default ``gpu.hami.io``), ``--output yaml|json|table|wide`` (YAML, the
default: one document per slice, ready for ``kubectl apply``; JSON: the slice, or a ``v1 List``
when the pool needs several; ``table``: one line per GPU; ``wide`` adds UUID, NUMA node, PCI bus
and compute mode), ``--policy-taint`` /
``--taint-unhealthy`` (``[=true|false]``) to preview the device taints the kubelet plugin adds on
clusters that keep them (1.36+); ``--mig-on-demand all|INDEX,UUID,...`` to preview the placements
and counter sets of cards in MIG on demand (in MIG mode: ``migEnabled: true`` in a devices file),
laid out for ``--kube-version 1.34|1.35|...`` (default 1.37). Exit status 2 with one line on
stderr for bad input or when NVML cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.devices.mig_on_demand import mark_on_demand
from dra_driver.devices.model import DeviceModelError
from dra_driver.devices.simulated import PROFILES
from dra_driver.devices.source import SOURCE_KINDS, DeviceSourceError, open_source
from dra_driver.flags import add_bool, env_default, parse_mig_on_demand
from dra_driver.output import JSON, TABLE, WIDE, YAML, add_output_flag, columns
from dra_driver.resource.slice_builder import SliceError, build_resource_slices

#: A Kubernetes object name that is a DNS subdomain (RFC 1123), as node names are.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "discover",
        help="print the ResourceSlice(s) this node would publish",
        description="Discover GPUs (NVML or simulated) and print the resource.k8s.io/v1 ResourceSlice(s).",
    )
    parser.add_argument("--source", choices=SOURCE_KINDS, help="nvml (real GPUs) or simulated")
    parser.add_argument("--profile", choices=sorted(PROFILES), help="simulated GPU model")
    parser.add_argument("--gpus", type=int, help="number of simulated GPUs (default: the profile's)")
    parser.add_argument("--devices-file", type=Path, help="YAML/JSON file describing simulated GPUs")
    parser.add_argument(
        "--nvidia-driver-root",
        type=Path,
        default=env_default(parser, "--nvidia-driver-root"),
        help="load libnvidia-ml.so.1 from below this driver root (nvml; env NVIDIA_DRIVER_ROOT)",
    )
    parser.add_argument(
        "--node-name",
        default=env_default(parser, "--node-name"),
        help="node name (env NODE_NAME; with --source nvml default: this host's name)",
    )
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    add_output_flag(parser, default=YAML, what="; table: one line per GPU, wide adds UUID, NUMA and PCI")
    add_bool(
        parser, "--policy-taint", default=False, env=False, help="add the policy-managed NoSchedule taint"
    )
    add_bool(parser, "--taint-unhealthy", default=False, env=False, help="taint unhealthy GPUs NoSchedule")
    parser.add_argument(
        "--mig-on-demand",
        type=parse_mig_on_demand,
        default=frozenset(),
        metavar="all|INDEX,UUID,...",
        help="cards in MIG mode to show as MIG on demand: their placements and counter sets",
    )
    parser.add_argument(
        "--kube-version",
        default="1.37",
        metavar="1.MINOR",
        help="the API server version whose counter layout MIG on demand uses (default 1.37)",
    )
    parser.set_defaults(handler=run)


def _layout(version: str) -> str:
    from dra_driver.resource.mig_on_demand_slices import layout_for

    major, _, minor = version.partition(".")
    if major != "1" or not minor.isdigit():
        raise UsageError(f"--kube-version: {version!r} is not 1.<minor> (e.g. 1.34)")
    return layout_for(int(minor))


def run(args: argparse.Namespace) -> int:
    kind = args.source or ("simulated" if args.profile or args.devices_file else "nvml")
    node_name = args.node_name or (host_node_name() if kind == "nvml" else None)
    if not node_name:
        raise UsageError("--node-name is required (or set NODE_NAME)")
    try:
        source = open_source(
            kind,
            node_name=node_name,
            profile=args.profile,
            gpus=args.gpus,
            devices_file=args.devices_file,
            driver_root=args.nvidia_driver_root,
        )
        gpus = mark_on_demand(source.discover(), args.mig_on_demand)
        slices = build_resource_slices(
            gpus,
            driver_name=args.driver_name,
            node_name=node_name,
            policy_taint=args.policy_taint,
            taint_unhealthy=args.taint_unhealthy,
            mig_on_demand_layout=_layout(args.kube_version) if args.mig_on_demand else None,
        )
    except (DeviceSourceError, DeviceModelError, SliceError) as err:
        raise UsageError(str(err)) from err
    sys.stdout.write(render(slices, args.output))
    return 0


def host_node_name() -> str:
    """This host's name as kubelet names its node by default: lower-cased; it must be a DNS subdomain."""
    name = socket.gethostname().lower()
    if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        raise UsageError(
            f"the host name {name!r} is not a valid node name: pass --node-name (or set NODE_NAME)"
        )
    return name


def _attribute(device: dict[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    found = next(iter(value.values()), None) if isinstance(value, dict) else None
    return "-" if found is None else str(found).lower() if isinstance(found, bool) else str(found)


def _capacity(device: dict[str, Any], name: str) -> str:
    return str(((device.get("capacity") or {}).get(name) or {}).get("value", "-"))


def device_rows(slices: list[dict[str, Any]], wide: bool) -> list[list[str]]:
    """One row per device of the slices: what ``-o table`` (``wide``) prints."""
    header = ["NODE", "DEVICE", "PRODUCT", "MEMORY", "CORES", "SLOTS", "ISOLATION", "HEALTHY"]
    if wide:
        header += ["UUID", "NUMA", "PCI", "COMPUTE-MODE", "TAINTS"]
    rows = [header]
    for item in slices:
        spec = item.get("spec") or {}
        for device in spec.get("devices") or ():
            row = [str(spec.get("nodeName") or "-"), str(device.get("name"))]
            row += [_attribute(device, "productName")]
            row += [_capacity(device, name) for name in ("memory", "cores", "slots")]
            row += [_attribute(device, "isolation"), _attribute(device, "healthy")]
            if wide:
                taints = ",".join(f"{t['key']}:{t['effect']}" for t in device.get("taints") or ()) or "-"
                row += [_attribute(device, "uuid"), _attribute(device, "resource.kubernetes.io/numaNode")]
                row += [_attribute(device, "resource.kubernetes.io/pciBusID")]
                row += [_attribute(device, "computeMode"), taints]
            rows.append(row)
    return rows


def render(slices: list[dict[str, Any]], output: str) -> str:
    """YAML documents, JSON (one object, or a v1 List for several slices), or a device table."""
    if output in (TABLE, WIDE):
        return "\n".join(columns(device_rows(slices, wide=output == WIDE))) + "\n"
    if output == JSON:
        document: Any = (
            slices[0] if len(slices) == 1 else {"apiVersion": "v1", "kind": "List", "items": slices}
        )
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True)
