"""``hami-dra explain pod/NAME [-n NS]`` (also ``kubectl hami-dra explain``): read the pod, its claims
and what the controller's informers list (slices, classes, claims, pods, nodes, the namespace's
quotas), and print :mod:`dra_driver.explain.report`.

Read-only. A tenant whose Role covers only its namespace still gets the decision record and its
claims; listing slices, nodes and other namespaces' claims and pods (needed to evaluate a pending
pod now) may be forbidden, which the output then says instead of failing (without Nodes, every
node with devices is taken as one the pod may run on).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.kube.config import (
    CLI_REQUEST_TIMEOUT,
    add_kubectl_flags,
    is_connection_error,
    load_kubectl_client,
    unreachable,
)
from dra_driver.output import DOCUMENTS, WIDE, add_output_flag, render_document


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why a pod's GPUs were placed where they are, or why it is still pending",
        description="Explain the controller's decision for a pod: the policy chain and where it came from, "
        "every candidate card's score and reason as the controller computed them, or for a pending pod "
        "the per-card reasons now and what would make it fit.",
    )
    parser.add_argument("target", help="pod/NAME or NAME")
    parser.add_argument(
        "-n", "--namespace", help="the pod's namespace (default: the context's, else default)"
    )
    add_kubectl_flags(parser)
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    add_output_flag(parser, what="; wide adds what would make each card fit")
    parser.set_defaults(handler=run)


def _pod_name(target: str) -> str:
    kind, sep, name = target.partition("/")
    if not sep:
        return target
    if kind not in ("pod", "pods", "po"):
        raise UsageError(f"explain takes pod/NAME, not {target!r}")
    return name


def run(args: argparse.Namespace) -> int:
    from kubernetes import client

    from dra_driver.controller.gang_refs import GROUP_RESOURCES, event_kind
    from dra_driver.controller.offline import ClusterObjects, bare_nodes
    from dra_driver.explain.render import render
    from dra_driver.explain.report import explain
    from dra_driver.kube.api import GPU_QUOTAS
    from dra_driver.resource.objects import pod_claim_names

    cluster = load_kubectl_client(args.kubeconfig, args.context)
    api_client, namespace = cluster.api_client, args.namespace or cluster.namespace
    core, resource = client.CoreV1Api(api_client), client.ResourceV1Api(api_client)
    name = _pod_name(args.target)

    def read(call: Any, *call_args: Any, **kwargs: Any) -> Any:
        try:
            response = call(
                *call_args, _preload_content=False, _request_timeout=CLI_REQUEST_TIMEOUT, **kwargs
            )
        except client.exceptions.ApiException:
            raise
        except Exception as err:
            if is_connection_error(err):
                raise unreachable(cluster.server, err) from None
            raise
        return json.loads(response.data)

    try:
        pod = read(core.read_namespaced_pod, name, namespace)
    except client.exceptions.ApiException as err:
        raise UsageError(f"pod {namespace}/{name}: {err.status} {err.reason}") from None
    claims = {}
    for _, claim_name in pod_claim_names(pod):
        if claim_name:
            try:
                claims[claim_name] = read(resource.read_namespaced_resource_claim, claim_name, namespace)
            except client.exceptions.ApiException as err:
                if err.status != 404:
                    raise UsageError(f"claim {namespace}/{claim_name}: {err.status} {err.reason}") from None
    missing: list[str] = []

    def listed(what: str, call: Any, *call_args: Any, **kwargs: Any) -> list[Any]:
        try:
            items: list[Any] = read(call, *call_args, **kwargs).get("items") or []
            return items
        except client.exceptions.ApiException as err:
            missing.append(f"{what} ({err.status} {err.reason})")
            return []

    def listed_or_namespaced(what: str, everywhere: Any, namespaced: Any) -> list[Any]:
        """Every namespace's, else (forbidden) the pod's namespace's, said so either way."""
        items = listed(f"{what} of all namespaces", everywhere)
        if missing and missing[-1].startswith(f"{what} of all namespaces"):
            items = items or listed(f"{what} of the namespace", namespaced, namespace)
        return items

    cluster_objects = ClusterObjects(
        slices=listed("ResourceSlices", resource.list_resource_slice),
        classes=listed("DeviceClasses", resource.list_device_class),
        claims=listed_or_namespaced(
            "claims", resource.list_resource_claim_for_all_namespaces, resource.list_namespaced_resource_claim
        ),
        pods=listed_or_namespaced("pods", core.list_pod_for_all_namespaces, core.list_namespaced_pod),
        resource_quotas=listed("ResourceQuotas", core.list_namespaced_resource_quota, namespace),
        gpu_quotas=listed(
            "GpuQuotas",
            client.CustomObjectsApi(api_client).list_namespaced_custom_object,
            GPU_QUOTAS.group,
            GPU_QUOTAS.version,
            namespace,
            GPU_QUOTAS.plural,
        ),
    )
    if missing and missing[-1].startswith("GpuQuotas (404"):
        missing.pop()  # the CRD is not installed: no quotas, as for the controller
    for group_resource in GROUP_RESOURCES:  # gangs' minimums, where the cluster serves them
        before = len(missing)
        for obj in listed(
            f"{group_resource.plural}.{group_resource.group}",
            client.CustomObjectsApi(api_client).list_namespaced_custom_object,
            group_resource.group,
            group_resource.version,
            namespace,
            group_resource.plural,
        ):
            cluster_objects.groups.append((event_kind(group_resource), obj))
        if len(missing) > before and "(404" in missing[-1]:
            missing.pop()  # not served here: no such groups, as for the controller
    nodes_before = len(missing)
    cluster_objects.nodes = listed("Nodes", core.list_node)
    if len(missing) > nodes_before:
        # A tenant may not list nodes: decide on every node with devices as if the pod may run
        # there, and say that node fit was not checked.
        cluster_objects.nodes = bare_nodes(cluster_objects.slices)
        missing[-1] += ", so node fit (selectors, taints, CPU/memory) is not checked"
    events = listed(
        "the pod's events",
        core.list_namespaced_event,
        namespace,
        field_selector=f"involvedObject.name={name}",
    )
    explanation = explain(pod, claims=claims, cluster=cluster_objects, driver=args.driver_name, events=events)
    if any(what.startswith("the pod's events") for what in missing):
        explanation.note = (explanation.note + "; " if explanation.note else "") + (
            f"could not list {missing[-1]}: kubelet's warnings are not shown"
        )
        missing = missing[:-1]
    if missing and explanation.state == "pending":
        explanation.note = (explanation.note + "; " if explanation.note else "") + (
            f"could not list {', '.join(missing)}: the evaluation now may miss cards or tenants"
        )
    if args.output in DOCUMENTS:
        sys.stdout.write(render_document(explanation.to_json(), args.output))
    else:
        print(render(explanation, wide=args.output == WIDE))
    return 0
