"""``hami-dra kubelet-plugin``: the node DaemonSet's process.

Usage::

    hami-dra kubelet-plugin --node-name "$NODE_NAME" --source nvml
    hami-dra kubelet-plugin --node-name node-1 --source simulated --profile t4 --gpus 4 \\
        --kubeconfig ~/.kube/config --plugin-dir /tmp/p --registry-dir /tmp/r --cdi-dir /var/run/cdi

Every documented flag has an environment variable named after it for the Helm chart
(``--node-name`` reads ``NODE_NAME``, ``--cdi-dir`` reads ``CDI_DIR``, ...; ``--help`` lists them);
the flags whose names say nothing of GPUs or DRA read it with the component's prefix
(``--source`` reads ``KUBELET_PLUGIN_SOURCE``; also ``_PROFILE``, ``_GPUS``, ``_PUBLISH``).
Booleans are ``--x[=true|false]`` and metrics listen on ``--metrics-bind-address HOST:PORT``; the
old spellings (``--no-policy-taint``, ``--no-publish``, ``--metrics-port``; env ``SOURCE``,
``DEVICE_SOURCE``, ``PROFILE``, ``GPU_PROFILE``, ``GPUS``, ``GPU_COUNT``, ``PUBLISH``, ``CDI_ROOT``,
``METRICS_PORT``) still work and log a deprecation warning. Runs until SIGTERM/SIGINT, then
deregisters and removes its sockets.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.flags import (
    add_bool,
    add_metrics_bind_address,
    env_default,
    metrics_address,
    parse_int,
    parse_mig_on_demand,
    parse_seconds,
    parse_xid_list,
)
from dra_driver.kube.config import load_api_client

if TYPE_CHECKING:
    from dra_driver.kubeletplugin.plugin import PluginOptions

LOG = logging.getLogger(__name__)

#: What the generic flags' variables start with: a bare ``SOURCE`` or ``GPUS`` in a container's
#: environment may well be meant for something else.
ENV_PREFIX = "KUBELET_PLUGIN_"


def _prefixed_env(parser: argparse.ArgumentParser, flag: str, *old: str, typed: bool = False) -> str | None:
    """``flag``'s value from ``KUBELET_PLUGIN_<FLAG>``, else from each deprecated ``old`` name in turn."""
    prefixed = "--" + ENV_PREFIX.lower().replace("_", "-") + flag.lstrip("-")
    for name in old:
        value = env_default(parser, prefixed, old=name, typed=typed)
        if value is not None:
            return value
    return None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "kubelet-plugin",
        help="run the node plugin (registration, DRA gRPC, ResourceSlices, CDI)",
        description="Serve kubelet's DRA API for this node's GPUs and publish their ResourceSlice.",
    )
    parser.add_argument(
        "--node-name", default=env_default(parser, "--node-name"), help="this node (env NODE_NAME)"
    )
    parser.add_argument(
        "--driver-name",
        default=env_default(parser, "--driver-name", DEFAULT_DRIVER_NAME),
        help="DRA driver name (env DRIVER_NAME)",
    )
    parser.add_argument(
        "--source",
        choices=("nvml", "simulated"),
        default=_prefixed_env(parser, "--source", "SOURCE", "DEVICE_SOURCE"),
        help=f"GPU source (env {ENV_PREFIX}SOURCE)",
    )
    parser.add_argument(
        "--nvidia-driver-root",
        type=Path,
        default=env_default(parser, "--nvidia-driver-root"),
        help="the host's NVIDIA driver root as mounted in this container; libnvidia-ml.so.1 is loaded "
        "from below it (nvml source; env NVIDIA_DRIVER_ROOT; default: the loader's usual places)",
    )
    parser.add_argument(
        "--profile",
        default=_prefixed_env(parser, "--profile", "PROFILE", "GPU_PROFILE"),
        help=f"simulated GPU model (env {ENV_PREFIX}PROFILE)",
    )
    parser.add_argument(
        "--gpus",
        type=parse_int,
        default=_prefixed_env(parser, "--gpus", "GPUS", "GPU_COUNT", typed=True),
        help=f"simulated GPU count (env {ENV_PREFIX}GPUS)",
    )
    parser.add_argument(
        "--devices-file",
        type=Path,
        default=env_default(parser, "--devices-file"),
        help="simulated GPUs from YAML/JSON (env DEVICES_FILE)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env_default(parser, "--kubeconfig"),
        help="default: in-cluster config (env KUBECONFIG)",
    )
    parser.add_argument(
        "--plugin-dir",
        type=Path,
        default=env_default(parser, "--plugin-dir", f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER_NAME}"),
        help="DRA socket, checkpoint and HAMi-core state (env PLUGIN_DIR)",
    )
    parser.add_argument(
        "--registry-dir",
        type=Path,
        default=env_default(parser, "--registry-dir", "/var/lib/kubelet/plugins_registry"),
        help="kubelet's plugin registration dir (env REGISTRY_DIR)",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=env_default(parser, "--cdi-dir", "/var/run/cdi", old="CDI_ROOT"),
        help="transient CDI specs (env CDI_DIR)",
    )
    parser.add_argument(
        "--hami-core-lib",
        type=Path,
        default=env_default(parser, "--hami-core-lib"),
        help="host path of libvgpu.so to preload in containers with shared GPUs (env HAMI_CORE_LIB)",
    )
    parser.add_argument(
        "--core-utilization-policy",
        choices=("default", "force", "disable"),
        default=env_default(parser, "--core-utilization-policy", "default"),
        help="HAMi-core's throttling of a cores limit: default (HAMi-core's own: throttle even on an idle "
        "GPU), force, or disable (cores only for placement); env CORE_UTILIZATION_POLICY",
    )
    parser.add_argument(
        "--nvidia-cdi-kind",
        default=env_default(parser, "--nvidia-cdi-kind", "nvidia.com/gpu"),
        help="CDI kind of the NVIDIA Container Toolkit's spec whose libraries, hooks and device nodes our "
        "claim specs carry (nvml source; tried before the GPU Operator's management.nvidia.com/gpu; "
        "'' = device nodes only; env NVIDIA_CDI_KIND)",
    )
    parser.add_argument(
        "--host-root",
        default=env_default(parser, "--host-root", "/"),
        help="where the host's / is seen, to check the host paths the toolkit's spec names ('' = do not "
        "check; env HOST_ROOT)",
    )
    parser.add_argument(
        "--host-driver-root",
        default=env_default(parser, "--host-driver-root", ""),
        help="the NVIDIA driver root's path on the host (kubeletPlugin.nvidiaDriverRoot), mounted here at "
        "--nvidia-driver-root: the host paths below it that the toolkit's spec names (device nodes, "
        "libraries) are checked there when --host-root is '' (env HOST_DRIVER_ROOT)",
    )
    add_bool(
        parser,
        "--allow-device-plugin",
        default=False,
        help="publish GPUs although NVIDIA's device plugin advertises nvidia.com/gpu on this node (only when "
        "the two use different GPUs)",
    )
    parser.add_argument("--recheck-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    #: How often NVML is tried again while the driver is not there (``driver_wait.py``).
    parser.add_argument("--driver-retry-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    add_metrics_bind_address(parser, default="0", old_env="METRICS_PORT")
    add_bool(
        parser,
        "--policy-taint",
        default=True,
        negation_alias=True,
        help="taint GPUs policy-managed (NoSchedule for the scheduler; our controller places them)",
    )
    parser.add_argument(
        "--health-file",
        type=Path,
        default=env_default(parser, "--health-file"),
        help="YAML/JSON {gpu-N: unhealthy|healthy} polled for GPU health (simulated nodes; env HEALTH_FILE)",
    )
    add_bool(
        parser,
        "--health-checks",
        default=True,
        help="watch the GPUs' health (NVML XID events; the health file on simulated nodes); false: every "
        "GPU is published as not monitored, like NVIDIA's DP_DISABLE_HEALTHCHECKS=all",
    )
    parser.add_argument(
        "--additional-xids-to-ignore",
        type=parse_xid_list,
        default=env_default(parser, "--additional-xids-to-ignore", "", typed=True),
        metavar="XID,...",
        help="XIDs that never mark a GPU unhealthy, on top of the application XIDs 13,31,43,45,68,109 "
        "(as NVIDIA's DRA driver's flag; env ADDITIONAL_XIDS_TO_IGNORE)",
    )
    parser.add_argument(
        "--mig-on-demand",
        type=parse_mig_on_demand,
        default=env_default(parser, "--mig-on-demand", "", typed=True),
        metavar="all|INDEX,UUID,...",
        help="cards (already in MIG mode) whose MIG instances are created on demand: they publish their "
        "possible placements, and prepare creates the instance a claim was given (needs partitionable "
        "devices: Kubernetes 1.36+, or DRAPartitionableDevices on; else static MIG). Switching a card "
        "is an admin procedure (docs/isolation.md). Default none (env MIG_ON_DEMAND)",
    )
    parser.add_argument(
        "--health-recovery-seconds",
        type=parse_seconds,
        default=env_default(parser, "--health-recovery-seconds", "300", typed=True),
        help="a GPU marked unhealthy is healthy again once this long has passed without an XID, NVML "
        "reaches it and no reset is pending; 0 = keep the mark until the plugin restarts, as NVIDIA's "
        "plugins do (default 300; env HEALTH_RECOVERY_SECONDS)",
    )
    add_bool(
        parser,
        "--publish",
        default=True,
        env=False,
        negation_alias=True,
        help=f"publish ResourceSlices; env {ENV_PREFIX}PUBLISH",
    )
    publish = _prefixed_env(parser, "--publish", "PUBLISH", typed=True)
    if publish is not None:
        parser.set_defaults(publish=publish)  # parsed by --publish's type, as add_bool's own variable
    parser.add_argument(
        "--boot-id-file", type=Path, default=Path("/proc/sys/kernel/random/boot_id"), help=argparse.SUPPRESS
    )
    parser.add_argument("--cleanup-seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.set_defaults(handler=run)


def plugin_options(args: argparse.Namespace) -> PluginOptions:
    """The plugin's options from the parsed command line."""
    from dra_driver.kubeletplugin.plugin import PluginOptions

    address = metrics_address(args)
    return PluginOptions(
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
        host_driver_root=PurePosixPath(args.host_driver_root) if args.host_driver_root else None,
        nvidia_driver_root=args.nvidia_driver_root,
        allow_device_plugin=args.allow_device_plugin,
        recheck_seconds=args.recheck_seconds,
        policy_taint=args.policy_taint,
        health_file=args.health_file,
        health_checks=args.health_checks,
        additional_xids_to_ignore=args.additional_xids_to_ignore,
        health_recovery_seconds=args.health_recovery_seconds,
        mig_on_demand=args.mig_on_demand,
        boot_id_file=args.boot_id_file,
        publish=args.publish,
        cleanup_seconds=args.cleanup_seconds,
        metrics_port=address.port if address else None,
        metrics_host=address.host if address else "",
    )


def run(args: argparse.Namespace) -> int:
    from dra_driver.devices.model import DeviceModelError, Gpu
    from dra_driver.devices.source import DeviceSourceError, open_source
    from dra_driver.kubeletplugin.driver_wait import DriverWait, serve_while_waiting
    from dra_driver.kubeletplugin.plugin import KubeletPlugin
    from dra_driver.kubeletplugin.server import SocketError

    if not args.node_name:
        raise UsageError("--node-name (or env NODE_NAME) is required")
    if not args.source:
        raise UsageError(
            "--source nvml|simulated is required (never guessed: fake GPUs would attract real pods)"
        )
    options = plugin_options(args)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    def discover() -> list[Gpu]:
        from dra_driver.devices.mig_on_demand import mark_on_demand

        found = open_source(
            args.source,
            node_name=args.node_name,
            profile=args.profile,
            gpus=args.gpus,
            devices_file=args.devices_file,
            driver_root=args.nvidia_driver_root,
        ).discover()
        return mark_on_demand(found, args.mig_on_demand)

    wait = DriverWait(discover, stop, retry_seconds=args.driver_retry_seconds)
    try:
        waiting = serve_while_waiting(wait, options.metrics_port, options.metrics_host)
    except OSError as err:
        raise UsageError(f"--metrics-bind-address: {err.strerror or err}") from None
    try:
        found = wait.run()
    except (DeviceSourceError, DeviceModelError) as err:
        raise UsageError(str(err)) from err
    finally:
        if waiting is not None:
            waiting.stop()
    if found is None:
        return 0  # stopped while waiting for the driver
    gpus = found
    api_client = load_api_client(args.kubeconfig)
    plugin = KubeletPlugin(options, gpus, api_client)
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
