"""``hami-dra top [gpus|nodes]``: GPU tenants, usage, isolation, health and pending pods, live.

Usage::

    hami-dra top                      # one line per GPU, namespace of the current context
    hami-dra top nodes -A             # one line per node, every namespace
    hami-dra top gpus -n team-a -o wide
    hami-dra top -A -o json           # the stable document described in dra_driver/top/render.py
    kubectl hami-dra top -A           # the same, as a kubectl plugin (see below)

Options: ``-A/--all-namespaces``, ``-n/--namespace`` (default: the context's namespace, else
``default``), ``--kubeconfig``, ``--context``, ``-o/--output table|wide|json|yaml``,
``--driver-name`` (default ``gpu.hami.io``). Read-only: it lists ResourceSlices, ResourceClaims
and Pods, so a namespaced user sees their namespace with ``-n`` and an admin the whole cluster
with ``-A``. Without ``-A`` the tenants and pending pods are the namespace's, while a card's usage
is the card's (every namespace's claims); only a user who may not list claims of all namespaces
gets the namespace's share, and the table says so.

kubectl plugin: the distribution installs the same entry point as ``kubectl-hami_dra`` too (a
symlink ``kubectl-hami_dra -> hami-dra`` on ``PATH`` does the same), so ``kubectl hami-dra top``
runs this command; kubectl passes the arguments after the plugin name through unchanged.

Exit status 2 with one line on stderr when the cluster cannot be reached, the kubeconfig cannot
be loaded or a list is forbidden.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.kube.config import add_kubectl_flags, load_kubectl_client
from dra_driver.output import DOCUMENTS, WIDE, add_output_flag
from dra_driver.top import GPUS, NODES

VIEWS = {GPUS: GPUS, "gpu": GPUS, NODES: NODES, "node": NODES}


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "top",
        help="GPU tenants, memory/cores used, isolation, health and pending pods, from the live cluster",
        description="Shows, from the live cluster, each GPU (or node) of the driver: its tenants "
        "(namespace/pod/claim), memory, cores and slots used out of total, isolation and health, "
        "and the pods the controller holds pending, by reason. Read-only.",
    )
    parser.add_argument(
        "view", nargs="?", default=GPUS, choices=sorted(VIEWS), help="one line per GPU (default) or node"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="claims and pods of every namespace"
    )
    scope.add_argument("-n", "--namespace", help="namespace (default: the context's, else 'default')")
    add_kubectl_flags(parser)
    add_output_flag(parser, what="; wide adds UUIDs and pending messages")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.top.client import fetch
    from dra_driver.top.objects import parse_claim, parse_pod, parse_slices
    from dra_driver.top.render import render_json, render_table
    from dra_driver.top.report import build_report

    connection = load_kubectl_client(args.kubeconfig, args.context)
    namespace = None if args.all_namespaces else (args.namespace or connection.namespace)
    objects = fetch(connection, args.driver_name, namespace)
    claims = [parse_claim(claim, args.driver_name) for claim in objects.claims]
    report = build_report(
        parse_slices(objects.slices, args.driver_name),
        [claim for claim in claims if claim is not None],
        [parse_pod(pod) for pod in objects.pods],
        driver=args.driver_name,
        namespace=namespace,
        usage_namespace=objects.claims_namespace,
    )
    if args.output in DOCUMENTS:
        sys.stdout.write(render_json(report, args.output))
    else:
        sys.stdout.write(render_table(report, VIEWS[args.view], wide=args.output == WIDE))
    return 0
