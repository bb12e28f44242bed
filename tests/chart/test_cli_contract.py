"""The rendered container arguments parse with the real `hami-dra` command line.

Each component's subcommand is written by another part of the project; until it is registered in
dra_driver.cli the check for that component is skipped, naming the missing subcommand.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from tests.chart.combos import SIMULATED
from tests.chart.helpers import ALL_ON, Render, container, find


def _parser() -> argparse.ArgumentParser:
    from dra_driver import cli

    try:
        return cli.build_parser()
    except Exception as err:  # a half-written module of another component must not fail chart tests
        pytest.skip(f"dra_driver.cli.build_parser() fails: {err}")


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


CASES = [
    ("DaemonSet", "kubelet-plugin", None, False),
    ("DaemonSet", "kubelet-plugin", SIMULATED, False),
    ("DaemonSet", "kubelet-plugin", None, True),
    ("Deployment", "controller", None, False),
    ("Deployment", "controller", None, True),
    ("Deployment", "webhook", None, False),
    ("Deployment", "webhook", None, True),
]


@pytest.mark.parametrize(
    ("kind", "component", "values", "all_on"),
    CASES,
    ids=[f"{c}-{'all' if a else 'simulated' if v else 'default'}" for _, c, v, a in CASES],
)
def test_args_parse(render: Render, kind: str, component: str, values: dict | None, all_on: bool) -> None:
    parser = _parser()
    if component not in _subcommands(parser):
        pytest.skip(f"`hami-dra {component}` is not registered in dra_driver.cli yet")
    workload = find(render(values=values, values_file=ALL_ON if all_on else None), kind, component)
    args = [a.replace("$(NODE_NAME)", "node-a") for a in container(workload)["args"]]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"`hami-dra {' '.join(args)}` is rejected: {stderr.getvalue().strip()}")
    assert parsed.command == component


@pytest.mark.parametrize("enabled", [True, False])
def test_the_preemption_value_reaches_the_controller_and_its_rbac(render: Render, enabled: bool) -> None:
    """``controller.preemption.enabled`` is the controller's ``--preemption`` (default on); the
    controller may create evictions only where it preempts."""
    objects = render(values={"controller": {"preemption": {"enabled": enabled}}})
    args = container(find(objects, "Deployment", "controller"))["args"]
    parsed = _parser().parse_args(args)
    assert parsed.preemption is enabled
    assert ("--no-preemption" in args) is not enabled
    rules = find(objects, "ClusterRole", "controller")["rules"]
    evictions = [rule for rule in rules if "pods/eviction" in rule.get("resources", ())]
    assert evictions == (
        [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}] if enabled else []
    )
