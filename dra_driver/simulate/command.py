"""``hami-dra simulate SCENARIO.yaml [--output table|json] [--max-candidates N]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from dra_driver.cli import UsageError
from dra_driver.engine import DEFAULT_MAX_CANDIDATES
from dra_driver.simulate.render import print_tables, result_to_json
from dra_driver.simulate.run import run_scenario
from dra_driver.simulate.scenario import ScenarioError, load_scenario


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="place a scenario's claims offline with the policy engine and explain each decision",
        description="Places the scenario's claims in order (each placement updates usage) and prints, per "
        "claim, the chosen node and GPUs or the pending reason, with every candidate card's score.",
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML file (see README, 'Scenario files')")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument(
        "--max-candidates",
        type=int,
        default=DEFAULT_MAX_CANDIDATES,
        help="for pending claims, list at most this many cards of the best-ranked nodes (default 32)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.max_candidates < 1:
        raise UsageError("--max-candidates must be at least 1")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        raise UsageError(str(err)) from None
    result = run_scenario(scenario, max_candidates=args.max_candidates)
    if args.output == "json":
        sys.stdout.write(result_to_json(result) + "\n")
    else:
        console = Console(width=None if sys.stdout.isatty() else 140)
        print_tables(result, console)
    return 0
