"""``hami-dra controller``: run the allocation controller until interrupted."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
import uuid
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME, heap
from dra_driver.cli import UsageError
from dra_driver.engine import DEFAULT_CARD_POLICY, DEFAULT_NODE_POLICY
from dra_driver.flags import add_metrics_bind_address, cannot_listen, metrics_address
from dra_driver.kube.config import load_api_client
from dra_driver.webhook.optin import NAMESPACE_LABEL, NAMESPACE_LABEL_VALUE, TRANSLATE_MODES, parse_selector

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "controller",
        help="allocation controller: place claims of our DeviceClasses with the policy engine",
        description="Allocate ResourceClaims of our DeviceClasses for gated pods, with policy chains.",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    parser.add_argument("--leader-elect", action="store_true", help="elect a leader with a Lease")
    parser.add_argument("--leader-elect-namespace", default="kube-system", help="namespace of the Lease")
    add_metrics_bind_address(parser, default=":8080", what="Prometheus /metrics")
    parser.add_argument("--default-policy", default=DEFAULT_CARD_POLICY, help="card policy chain default")
    parser.add_argument(
        "--default-node-policy", default=DEFAULT_NODE_POLICY.value, help="node policy default"
    )
    parser.add_argument(
        "--hami-translate",
        choices=TRANSLATE_MODES,
        default="namespaces",
        help="where to create the ResourceClaimTemplates of pods the webhook translated from HAMi's "
        f"resources: namespaces labelled {NAMESPACE_LABEL}={NAMESPACE_LABEL_VALUE}, namespaces matching "
        "--hami-namespace-selector (all), or nowhere (off); as the webhook's (default namespaces)",
    )
    parser.add_argument(
        "--hami-namespace-selector",
        default="{}",
        help="with --hami-translate=all: the webhook configuration's namespaceSelector as JSON "
        "(default {}: every namespace)",
    )
    parser.add_argument(
        "--hami-device-class",
        default=None,
        help="DeviceClass of the translated pods' templates (default: the class named like the driver)",
    )
    parser.add_argument(
        "--normal-event-rate",
        type=float,
        default=10.0,
        help="Normal events (Allocated) a second at most, past --normal-event-burst; the rest are "
        "dropped (the pod's decision annotation says the same): each is one more API write per pod. "
        "0 with a burst of 0: none; negative: every one (default 10)",
    )
    parser.add_argument(
        "--normal-event-burst",
        type=int,
        default=100,
        help="Normal events sent at once before --normal-event-rate applies (default 100)",
    )
    parser.add_argument(
        "--gang-timeout",
        type=float,
        default=60.0,
        help="seconds a gang (pods of one pod group) waits quietly for enough members to be placeable "
        "before each member gets an event and condition saying why; a coscheduling PodGroup's "
        "scheduleTimeoutSeconds replaces it for that group (default 60)",
    )
    parser.add_argument(
        "--preemption",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evict the cheapest lower-priority GPU shares on one node for a pod that fits nowhere, "
        "through the Eviction API (PodDisruptionBudgets respected), and hold the capacity for it "
        "(default on; --no-preemption: pods wait for capacity to be released)",
    )
    parser.add_argument(
        "--write-workers",
        type=int,
        default=4,
        help="binds written at once (claim allocations and gates in flight); each holds one API "
        "connection (default 4)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.config import ConfigError, ControllerDefaults

    try:
        defaults = ControllerDefaults(policy=args.default_policy, node_policy=args.default_node_policy)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    try:
        selector = parse_selector(args.hami_namespace_selector)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.normal_event_burst < 0:
        raise UsageError("--normal-event-burst must be at least 0")
    if args.gang_timeout < 0:
        raise UsageError("--gang-timeout must be at least 0")
    if args.write_workers < 1:
        raise UsageError("--write-workers must be at least 1")
    address = metrics_address(args)
    from dra_driver.controller.controller import Controller, api_connections
    from dra_driver.controller.hami_templates import HamiTemplates, KubeNamespaces
    from dra_driver.controller.metrics import ControllerMetrics
    from dra_driver.kube.api import Kube
    from dra_driver.kube.errors import KubeError
    from dra_driver.kube.events import TokenBucket
    from dra_driver.kube.leader import LeaderElector
    from dra_driver.webhook.optin import namespace_gate

    kube = Kube(load_api_client(args.kubeconfig, connections=api_connections(args.write_workers)))
    hami_templates = None
    if args.hami_translate != "off":
        gate = namespace_gate(args.hami_translate, selector, KubeNamespaces(kube))
        device_class = args.hami_device_class or args.driver_name
        hami_templates = HamiTemplates(kube, args.driver_name, device_class, gate)
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    metrics = ControllerMetrics()
    elector = None
    if args.leader_elect:
        elector = LeaderElector(kube, args.leader_elect_namespace, identity)
        elector.start()
    controller = Controller(
        kube,
        args.driver_name,
        defaults,
        is_leader=elector.is_leader if elector else None,
        identity=identity,
        metrics=metrics,
        # Events are sent by their own thread: a writer thread waiting an event's round trip
        # per pod cost a quarter of the bind throughput (docs/performance.md).
        background_events=True,
        normal_event_budget=(
            TokenBucket(args.normal_event_rate, args.normal_event_burst)
            if args.normal_event_rate >= 0
            else None
        ),
        write_workers=args.write_workers,
        hami_templates=hami_templates,
        gang_timeout=args.gang_timeout,
        preemption=args.preemption,
    )
    if address is not None:
        try:
            metrics.serve(address.port, address.host)
        except OSError as err:
            raise UsageError(cannot_listen(address, err)) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    heap.tune()
    try:
        controller.start()
    except KubeError as err:
        raise UsageError(f"cannot reach the API server: {err}") from None
    heap.settle()  # the caches and the placement state are built: no collection walks them again
    role = (
        "without leader election" if elector is None
        else "as leader" if elector.is_leader()
        else f"as standby (allocates once it holds lease {args.leader_elect_namespace}/{elector.name})"
    )  # fmt: skip
    log.warning("hami-dra controller %s running for driver %s %s", identity, args.driver_name, role)
    try:
        stop.wait()
    finally:
        controller.stop()
        if elector is not None:
            elector.stop()
    return 0
