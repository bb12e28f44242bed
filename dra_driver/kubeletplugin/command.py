"""``hami-dra kubelet-plugin``: the node DaemonSet's process.

Usage::

    hami-dra kubelet-plugin --node-name "$NODE_NAME" --source nvml
    hami-dra kubelet-plugin --node-name node-1 --source simulated --profile t4 --gpus 4 \\
        --kubeconfig ~/.kube/config --plugin-dir /tmp/p --registry-dir /tmp/r --cdi-dir /var/run/cdi

Every flag has an environment equivalent for the Helm chart (``NODE_NAME``, ``DRIVER_NAME``,
``DEVICE_SOURCE``, ``GPU_PROFILE``, ``GPU_COUNT``, ``DEVICES_FILE``, ``KUBECONFIG``, ``PLUGIN_DIR``,
``REGISTRY_DIR``, ``CDI_ROOT``, ``HAMI_CORE_LIB``, ``NVIDIA_CDI_KIND``, ``METRICS_PORT``,
``HEALTH_FILE``). Runs until SIGTERM/SIGINT, then deregisters and removes its sockets.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.kubeconfig import load_api_client

LOG = logging.getLogger(__name__)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"environment variable {name} must be an integer, got {value!r}") from None


def _env_path(name: str, default: str | None = None) -> Path | None:
    value = _env(name, default)
    return Path(value) if value else None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kubelet-plugin",
        help="run the node plugin (registration, DRA gRPC, ResourceSlices, CDI)",
        description="Serve kubelet's DRA API for this node's GPUs and publish their ResourceSlice.",
    )
    parser.add_argument("--node-name", default=_env("NODE_NAME"), help="this node (env NODE_NAME)")
    parser.add_argument(
        "--driver-name",
        default=_env("DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help="DRA driver name (env DRIVER_NAME)",
    )
    parser.add_argument(
        "--source",
        choices=("nvml", "simulated"),
        default=_env("DEVICE_SOURCE"),
        help="GPU source (env DEVICE_SOURCE)",
    )
    parser.add_argument(
        "--nvidia-driver-root",
        type=Path,
        default=_env_path("NVIDIA_DRIVER_ROOT"),
        help="the host's NVIDIA driver root as mounted in this container; libnvidia-ml.so.1 is loaded "
        "from below it (nvml source; env NVIDIA_DRIVER_ROOT; default: the loader's usual places)",
    )
    parser.add_argument("--profile", default=_env("GPU_PROFILE"), help="simulated GPU model")
    parser.add_argument("--gpus", type=int, default=_env_int("GPU_COUNT"), help="simulated GPU count")
    parser.add_argument(
        "--devices-file", type=Path, default=_env_path("DEVICES_FILE"), help="simulated GPUs from YAML/JSON"
    )
    parser.add_argument("--kubeconfig", default=_env("KUBECONFIG"), help="default: in-cluster config")
    parser.add_argument(
        "--plugin-dir",
        type=Path,
        default=_env_path("PLUGIN_DIR", f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER_NAME}"),
        help="DRA socket, checkpoint and HAMi-core state (env PLUGIN_DIR)",
    )
    parser.add_argument(
        "--registry-dir",
        type=Path,
        default=_env_path("REGISTRY_DIR", "/var/lib/kubelet/plugins_registry"),
        help="kubelet's plugin registration dir (env REGISTRY_DIR)",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=_env_path("CDI_ROOT", "/var/run/cdi"),
        help="transient CDI specs (env CDI_ROOT)",
    )
    parser.add_argument(
        "--hami-core-lib",
        type=Path,
        default=_env_path("HAMI_CORE_LIB"),
        help="host path of libvgpu.so to preload in containers with shared GPUs (env HAMI_CORE_LIB)",
    )
    parser.add_argument(
        "--core-utilization-policy",
        choices=("default", "force", "disable"),
        default=_env("CORE_UTILIZATION_POLICY", "default"),
        help="HAMi-core's throttling of a cores limit: default (HAMi-core's own: throttle even on an idle "
        "GPU), force, or disable (cores only for placement); env CORE_UTILIZATION_POLICY",
    )
    parser.add_argument(
        "--nvidia-cdi-kind",
        default=_env("NVIDIA_CDI_KIND", "nvidia.com/gpu"),
        help="CDI kind of the NVIDIA Container Toolkit's spec whose libraries, hooks and device nodes our "
        "claim specs carry (nvml source; tried before the GPU Operator's management.nvidia.com/gpu; "
        "'' = device nodes only; env NVIDIA_CDI_KIND)",
    )
    parser.add_argument(
        "--host-root",
        default=_env("HOST_ROOT", "/"),
        help="where the host's / is seen, to check the host paths the toolkit's spec names ('' = do not "
        "check; env HOST_ROOT)",
    )
    parser.add_argument(
        "--allow-device-plugin",
        action="store_true",
        default=os.environ.get("ALLOW_DEVICE_PLUGIN", "").lower() in ("1", "true"),
        help="publish GPUs although NVIDIA's device plugin advertises nvidia.com/gpu on this node (only when "
        "the two use different GPUs; env ALLOW_DEVICE_PLUGIN)",
    )
    parser.add_argument("--recheck-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--metrics-port", type=int, default=_env_int("METRICS_PORT"), help="serve /metrics (env METRICS_PORT)"
    )
    parser.add_argument("--no-policy-taint", action="store_true", help="do not taint GPUs policy-managed")
    parser.add_argument(
        "--health-file",
        type=Path,
        default=_env_path("HEALTH_FILE"),
        help="YAML/JSON {gpu-N: unhealthy|healthy} polled for GPU health (simulated nodes; env HEALTH_FILE)",
    )
    parser.add_argument("--no-publish", action="store_true", help="do not publish ResourceSlices")
    parser.add_argument(
        "--boot-id-file", type=Path, default=Path("/proc/sys/kernel/random/boot_id"), help=argparse.SUPPRESS
    )
    parser.add_argument("--cleanup-seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.devices.model import DeviceModelError
    from dra_driver.devices.source import DeviceSourceError, open_source
    from dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginOptions
    from dra_driver.kubeletplugin.server import SocketError

    if not args.node_name:
        raise UsageError("--node-name (or env NODE_NAME) is required")
    if not args.source:
        raise UsageError(
            "--source nvml|simulated is required (never guessed: fake GPUs would attract real pods)"
        )
    try:
        gpus = open_source(
            args.source,
            node_name=args.node_name,
            profile=args.profile,
            gpus=args.gpus,
            devices_file=args.devices_file,
            driver_root=args.nvidia_driver_root,
        ).discover()
    except (DeviceSourceError, DeviceModelError) as err:
        raise UsageError(str(err)) from err
    api_client = load_api_client(args.kubeconfig)
    options = PluginOptions(
        node_name=args.node_name,
        driver_name=args.driver_name,
        plugin_dir=args.plugin_dir,
        registry_dir=args.registry_dir,
        cdi_dir=args.cdi_dir,
        simulated=args.source == "simulated",
        hami_core_lib=args.hami_core_lib,
        core_utilization_policy=args.core_utilization_policy,
        nvidia_cdi_kind=args.nvidia_cdi_kind or None,
        host_root=Path(args.host_root) if args.host_root else None,
        allow_device_plugin=args.allow_device_plugin,
        recheck_seconds=args.recheck_seconds,
        policy_taint=not args.no_policy_taint,
        health_file=args.health_file,
        boot_id_file=args.boot_id_file,
        publish=not args.no_publish,
        cleanup_seconds=args.cleanup_seconds,
        metrics_port=args.metrics_port,
    )
    plugin = KubeletPlugin(options, gpus, api_client)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        plugin.start()
    except (SocketError, OSError) as err:
        plugin.stop()
        raise UsageError(str(err)) from None
    LOG.warning("kubelet plugin %s serving %d GPU(s) on node %s", args.driver_name, len(gpus), args.node_name)
    print(f"ready: {plugin.servers.registration_socket}", flush=True)
    stop.wait()
    plugin.stop()
    return 0
