"""``hami-dra controller``: run the allocation controller until interrupted."""

from __future__ import annotations

import argparse
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.engine import DEFAULT_CARD_POLICY, DEFAULT_NODE_POLICY


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
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (0: off)")
    parser.add_argument("--default-policy", default=DEFAULT_CARD_POLICY, help="card policy chain default")
    parser.add_argument(
        "--default-node-policy", default=DEFAULT_NODE_POLICY.value, help="node policy default"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.config import ConfigError, ControllerDefaults

    try:
        ControllerDefaults(policy=args.default_policy, node_policy=args.default_node_policy)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    raise UsageError("the controller is not implemented yet")
