"""``hami-dra demo``: run the lab scenario on a sandbox cluster and exit 0 only if it all came true.

Usage::

    hami-dra demo                 # what `make demo` runs
    hami-dra demo --no-kubectl    # API views only, even when kubectl is installed

Everything it starts (API server, kubelet simulator, kubelet plugin, webhook, controller) runs in
this process and is stopped, and its temp dirs removed, before it exits, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from dra_driver.cli import UsageError
from hami_dra_dev.demo import manifests, render
from hami_dra_dev.demo.checks import Checks

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="replay the worked example's lab (4x Tesla T4, mutex,binpack -> GPU 2) on a sandbox cluster",
        description="Start a sandbox cluster with the real kubelet plugin, webhook and controller, replay "
        "the worked example, print what happened and check it (exit 1 on any mismatch).",
    )
    parser.add_argument("--no-kubectl", action="store_true", help="do not run kubectl even if installed")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds to wait for each outcome (default 20)"
    )
    parser.set_defaults(handler=run)


def execute(console: Console, *, use_kubectl: bool = True, timeout: float = 20.0) -> Checks:
    """Start the stack, run the scenario, stop everything; problems become failed checks."""
    from hami_dra_dev.demo.observe import Kubectl
    from hami_dra_dev.demo.scenario import Scenario
    from hami_dra_dev.demo.stack import DemoStack

    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="hami-dra-demo-kubectl-") as cache:
        try:
            with DemoStack.start() as stack:
                url = stack.server.url if stack.server else "?"
                console.print(f"sandbox API server {url}, node {manifests.NODE}")
                kubectl = Kubectl(stack.kubeconfig, Path(cache)) if use_kubectl else None
                checks = Scenario(stack, console, kubectl, timeout).run()
        except Exception as err:  # start-up/tear-down problems are reported as a failed check
            log.debug("demo failed", exc_info=True)
            checks.fail("demo runs", "no error", f"{type(err).__name__}: {err}")
    return checks


def run_demo(file: IO[str] | None = None, *, use_kubectl: bool = True, timeout: float = 20.0) -> int:
    """Run the demo, printing to ``file`` (stdout by default); returns the exit code."""
    console = render.make_console(file)
    started = time.monotonic()
    console.rule(
        "hami-dra demo: the worked example's lab, one node with four Tesla T4 (14967 MiB usable)",
        align="left",
    )
    checks = execute(console, use_kubectl=use_kubectl, timeout=timeout)
    console.rule("Result", align="left")
    console.print(render.checks_table(checks.items))
    elapsed = time.monotonic() - started
    if checks.passed:
        console.print(
            f"All {len(checks.items)} checks passed in {elapsed:.1f}s; everything stopped and cleaned up."
        )
        return 0
    for failure in checks.failures:
        console.print(f"FAILED: {failure.name}: expected {failure.expected}, observed {failure.observed}")
    return 1


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    if args.verbose == 0:
        # The demo prints the controller's decisions and pending reasons itself; its warning log
        # lines would only interleave with the tables (-v shows them again).
        for package in ("dra_driver", "hami_dra_dev"):
            logging.getLogger(package).setLevel(logging.ERROR)
    return run_demo(use_kubectl=not args.no_kubectl, timeout=args.timeout)
