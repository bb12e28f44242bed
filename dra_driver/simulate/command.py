"""``hami-dra simulate``: place claims offline with the policy engine, from a file or the live cluster.

How it is used::

    hami-dra simulate SCENARIO.yaml                          # a hand-written or saved scenario
    hami-dra simulate --from-cluster --claims what-if.yaml   # what-ifs on the cluster as it is now
    hami-dra simulate --from-cluster --save snap.yaml        # save the cluster, edit it, then
    hami-dra simulate snap.yaml [--claims what-if.yaml]      # run it offline, as often as needed

``--from-cluster`` reads what the controller's informers list and places ``--claims``' claims in
order with the controller's own allocator over the controller's own cache (``cluster.py``: node
fit, quotas and per-container limits included, as ``explain`` decides): one command answers
"where would this pod go now, and why?".
``--save`` writes the snapshot (``snapshot.py``: our driver's GPUs, every allocated claim's use of
them and the GPU quotas) as a scenario file (with the ``--claims`` claims, if given) to edit by
hand: remove a tenant, drain a node, add cards, change a quota, and run ``simulate FILE`` on it as
often as needed without touching the cluster (with the policy engine and the quotas: a scenario
has no Node objects, so no node fit). A ``.json`` name writes JSON, which loads about ten times
faster than YAML for a cluster of thousands of nodes.

The claims file is a list of claims, or a mapping with ``claims`` and optionally ``defaults``
(which then replace the scenario's); claims are as in a scenario file (docs/simulate.md, "Scenario files").
Existing tenants and new claims are checked against the quotas; the claims are placed in order,
each seeing the ones before it.

``-o json`` (or ``yaml``) prints a stable document (``render.py``); ``-o table`` (the default) a
table per claim, drawn on a terminal and plain columns in a pipe; ``-o wide`` adds the cores used
(``-o`` is the output format, so the snapshot file is ``--save``). Exit code 2, with one line per
problem, for a bad file or an unreachable cluster; with ``--fail-on-pending``, exit code 1 when a
claim stays pending (the output is printed all the same).
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError, program_name
from dra_driver.engine import DEFAULT_MAX_CANDIDATES
from dra_driver.kube.config import (
    add_kubectl_flags,
    is_connection_error,
    load_kubectl_client,
    unreachable,
)
from dra_driver.output import JSON, WIDE, YAML, add_output_flag, is_terminal

#: Exit status of ``--fail-on-pending`` when a claim stays pending (2 is a usage error).
EXIT_PENDING = 1

DESCRIPTION = """\
Places claims in order (each placement updates usage) and prints, per claim, the chosen node and
GPUs or the pending reason, with every candidate card's score.

The cluster is a scenario file, or the live cluster (--from-cluster), where what-if claims
(--claims) are placed by the controller's own allocator: node fit, quotas and limits included.
Or save the live cluster as a scenario (--save: our driver's GPUs, the allocated claims' shares,
the GPU quotas), edit it (remove tenants, add nodes, change quotas) and run 'simulate FILE' on it
offline.
"""

EPILOG = """\
examples:
  hami-dra simulate examples/worked-example.yaml
  hami-dra simulate --from-cluster --claims what-if.yaml -o json
  hami-dra simulate --from-cluster --context prod --save snapshot.yaml
  hami-dra simulate snapshot.yaml --claims what-if.yaml

claims file (--claims):
  claims:
    - {name: train, namespace: team-a, count: 2, memory: 20Gi, policy: "binpack,numa"}
    - {name: notebook, memory: 4Gi, cores: 20}
"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="place claims offline with the policy engine (on a scenario file or the live cluster) "
        "and explain each decision",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scenario", type=Path, nargs="?", help="scenario file, YAML or JSON (docs/simulate.md)"
    )
    parser.add_argument(
        "--from-cluster",
        action="store_true",
        help="start from a snapshot of the live cluster instead of a scenario file",
    )
    parser.add_argument(
        "--claims",
        type=Path,
        metavar="FILE",
        help="claims to place after the scenario's own (a list, or a mapping with 'claims' and 'defaults')",
    )
    parser.add_argument(
        "--save",
        metavar="FILE",
        help="with --from-cluster: write the snapshot (and --claims' claims) as a scenario file; "
        "JSON if FILE ends in .json, else YAML; '-' for stdout",
    )
    add_kubectl_flags(parser)
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name of our slices")
    add_output_flag(parser, what="; wide adds the cores used")
    parser.add_argument(
        "--fail-on-pending",
        action="store_true",
        help=f"exit with status {EXIT_PENDING} when a claim stays pending (for CI: 'will this fit?')",
    )
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=DEFAULT_MAX_CANDIDATES,
        help="for pending claims, list at most this many cards of the best-ranked nodes (default 32)",
    )
    parser.set_defaults(handler=run)


def _check(args: argparse.Namespace) -> None:
    if args.max_candidates < 1:
        raise UsageError("--max-candidates must be at least 1")
    if args.from_cluster == (args.scenario is not None):
        raise UsageError("give a scenario file or --from-cluster (one of them)")
    if not args.from_cluster:
        for flag, value in (
            ("--save", args.save),
            ("--kubeconfig", args.kubeconfig),
            ("--context", args.context),
        ):
            if value is not None:
                raise UsageError(f"{flag} goes with --from-cluster")
    elif args.claims is None and args.save is None:
        raise UsageError(
            "nothing to place: give --claims FILE to place claims against the cluster, "
            "or --save FILE to write the snapshot (then edit it and run 'simulate FILE')"
        )
    if args.save == "-" and args.claims is not None:
        raise UsageError("--save - writes the snapshot to stdout, where the results would go: save to a file")


@contextmanager
def _no_gc() -> Iterator[None]:
    """Run without the cycle collector: a snapshot of thousands of nodes is millions of objects
    that stay alive to the end, and collecting over them cost a third of the run (no cycles are
    made that would leak: this is a short-lived command)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    _check(args)
    with _no_gc():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from dra_driver.simulate.scenario import (
        ScenarioError,
        add_claims,
        parse_scenario,
        read_claims,
        read_document,
    )

    try:
        if args.from_cluster:
            objects, data = _snapshot(args)
            source = "the cluster snapshot"
        else:
            objects, data, source = None, read_document(args.scenario), str(args.scenario)
        claims = read_claims(args.claims) if args.claims is not None else None
        if claims is not None:
            data = add_claims(data, claims, source, str(args.claims))
        if args.save is not None:
            _save(data, args.save)
            if claims is None:
                return 0
        if objects is not None and claims is not None:
            result = _on_cluster(objects, claims, args)
        else:
            scenario = parse_scenario(data, source)
            _ignored_pods(scenario.claims)
            from dra_driver.simulate.run import run_scenario

            result = run_scenario(scenario, max_candidates=args.max_candidates)
    except ScenarioError as err:
        raise UsageError(str(err)) from None
    _print(result, args.output)
    pending = sum(decision.placement is None for decision in result.decisions)
    if pending and args.fail_on_pending:
        print(
            f"{program_name()} simulate: {pending} of {len(result.decisions)} claims stay pending",
            file=sys.stderr,
        )
        return EXIT_PENDING
    return 0


def _on_cluster(objects: Any, claims: dict[str, Any], args: argparse.Namespace) -> Any:
    """The claims file's claims placed by the controller's allocator on the cluster's objects
    (``simulate/cluster.py``)."""
    from dra_driver.simulate.cluster import simulate_on_cluster
    from dra_driver.simulate.scenario import ClaimsFile

    parsed = ClaimsFile.model_validate(claims)
    simulation = simulate_on_cluster(
        objects, parsed.claims, args.driver_name, parsed.defaults, max_candidates=args.max_candidates
    )
    return simulation.result


def _ignored_pods(claims: Any) -> None:
    """A claim's ``pod`` is node fit, which needs the cluster's Node objects, and its priority and
    gang are replayed on the cluster's pods: say they are not used."""
    for position, claim in enumerate(claims):
        if claim.pod is not None:
            print(
                f"{program_name()} simulate: warning: claims[{position}]({claim.name}).pod is not used: "
                "a scenario has no Node objects to fit it to (--from-cluster --claims checks it)",
                file=sys.stderr,
            )
        replayed = claim.replayed
        if replayed:
            print(
                f"{program_name()} simulate: warning: claims[{position}]({claim.name}).{'/'.join(replayed)} "
                "not used: a scenario has no pods to order, group or preempt "
                "(--from-cluster --claims replays them)",
                file=sys.stderr,
            )


def _print(result: Any, output: str) -> None:
    from dra_driver.simulate.render import plain_tables, print_tables, result_to_json, result_to_yaml

    if output == JSON:
        sys.stdout.write(result_to_json(result) + "\n")
    elif output == YAML:
        sys.stdout.write(result_to_yaml(result))
    elif is_terminal():
        from rich.console import Console

        print_tables(result, Console(), wide=output == WIDE)
    else:
        sys.stdout.write(plain_tables(result, wide=output == WIDE))


def _snapshot(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The cluster's objects as read (for placing ``--claims``) and as a scenario (for ``--save``)."""
    from dra_driver.kube.api import Kube
    from dra_driver.kube.errors import KubeError
    from dra_driver.simulate.snapshot import Source, fetch, take_snapshot

    cluster = load_kubectl_client(args.kubeconfig, args.context)
    api_client, source = cluster.api_client, Source(cluster.context, cluster.server)
    warnings: list[str] = []
    try:
        objects = fetch(Kube(api_client), warnings, placing=args.claims is not None)
    except KubeError as err:
        # Kube raises status 0 "from None": the connection error it replaced is its context.
        cause = err.__context__
        if err.status == 0 and cause is not None and is_connection_error(cause):
            raise unreachable(source.server, cause) from None
        raise UsageError(f"cannot read the cluster ({source.server}): {err}") from None
    finally:
        api_client.close()
    snapshot = take_snapshot(objects, args.driver_name, source)
    for warning in [*warnings, *snapshot.warnings]:
        print(f"{program_name()} simulate: warning: {warning}", file=sys.stderr)
    if not snapshot.data["nodes"]:
        raise UsageError(
            f"no node publishes a complete ResourceSlice pool of driver {args.driver_name} "
            f"in {source.context or source.server}: nothing to simulate on"
        )
    return objects, snapshot.data


SAVED_COMMENT = """\
A snapshot of {context} taken {taken} by `hami-dra simulate --from-cluster`.
Allocations are what the cluster holds (as the controller counts them, even past a card's
capacity); each names its claim. Edit freely (remove tenants, add nodes or cards, change quotas
or defaults), add claims here or in a claims file, then: hami-dra simulate FILE [--claims FILE]
"""


def _save(data: dict[str, Any], target: str) -> None:
    from dra_driver.simulate.documents import dump_document

    json_format = target.endswith(".json")
    info = data.get("snapshot") or {}
    comment = SAVED_COMMENT.format(
        context=info.get("context") or info.get("server") or "the cluster", taken=info.get("taken", "")
    )
    if target == "-":
        dump_document(data, sys.stdout, json_format=json_format, comment=comment)
        return
    try:
        with open(target, "w", encoding="utf-8") as out:
            dump_document(data, out, json_format=json_format, comment=comment)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror or err}") from None
    print(
        f"{program_name()} simulate: wrote {target}: {len(data['nodes'])} nodes, "
        f"{sum(len(node['gpus']) for node in data['nodes'])} GPUs",
        file=sys.stderr,
    )
