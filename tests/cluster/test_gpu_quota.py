"""GpuQuota on the real cluster: the real kube-apiserver serves the CRD (the chart's crds/, or
``install_crds`` for the host-process driver) and validates it; our controller enforces it.

The refusals are the cases tests/quota/test_crd.py checks on the bare API server tier, here
through kubectl (strict field validation by default: ``KUBECTL_REFUSALS``) and the CRD as the
chart or the host-process driver installs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest
from tests.cluster.test_e2e import POD_TIMEOUT, recipe_classes
from tests.quota.test_crd import INVALID, KUBECTL_REFUSALS, quota
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster
TEAM = "quota-team"
RECIPE = "binpack"


def team_pod(name: str) -> dict[str, Any]:
    body = manifests.pod(manifests.DemoPod(name, RECIPE, "gpu-0", "binpack stacks"))
    body["metadata"]["namespace"] = TEAM
    return body


def gpu_quota(memory: str) -> str:
    body = quota("team", {"hard": {"memory": memory, "devices": 2}})
    body["metadata"]["namespace"] = TEAM
    return yaml.safe_dump(body)


@pytest.fixture
def team(real_cluster: RealCluster, driver: DriverUnderTest) -> Iterator[RealCluster]:
    template = manifests.claim_template(RECIPE)
    template["metadata"]["namespace"] = TEAM
    real_cluster.kubectl("create", "namespace", TEAM)
    body = {"apiVersion": "v1", "kind": "List", "items": [*recipe_classes(driver, RECIPE), template]}
    real_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
    try:
        yield real_cluster
    finally:
        real_cluster.kubectl("delete", "namespace", TEAM, "--wait=true", "--timeout=120s")


def running(cluster: RealCluster, name: str) -> None:
    cluster.kubectl(
        "wait", "--for=condition=Ready", f"pod/{name}", "-n", TEAM, f"--timeout={POD_TIMEOUT:.0f}s"
    )


def test_the_real_api_server_refuses_what_the_sandbox_refuses(team: RealCluster) -> None:
    answers = {}
    for name, spec, _ in INVALID:
        body = quota(name, spec)
        body["metadata"]["namespace"] = TEAM
        answers[name] = team.kubectl("apply", "-f", "-", check=False, stdin=yaml.safe_dump(body))
    accepted = {name: out for name, out in answers.items() if "created" in out or "configured" in out}
    assert not accepted, f"accepted by the real API server: {accepted}"
    expected = {name: KUBECTL_REFUSALS.get(name, why) for name, _, why in INVALID}
    different = {name: answers[name] for name, why in expected.items() if why not in answers[name]}
    assert not different, f"refused differently from the sandbox: {different}"


def test_a_quota_caps_the_namespace_and_explains_itself(team: RealCluster) -> None:
    team.kubectl("apply", "-f", "-", stdin=gpu_quota("1500Mi"))
    team.kubectl("apply", "-f", "-", stdin=json.dumps(team_pod("first")))
    running(team, "first")
    team.kubectl("apply", "-f", "-", stdin=json.dumps(team_pod("second")))
    expected = "GpuQuotaExceeded: quota-team/team memory: used 1000Mi + requested 1000Mi > hard 1500Mi"

    def described() -> str | None:
        text = team.kubectl("describe", "pod", "second", "-n", TEAM)
        return text if expected in text else None

    text = wait_for(described, 60, "the quota named in kubectl describe pod")
    assert "FailedAllocation" in text
    assert team.get("pod", "second", "-n", TEAM)["status"]["phase"] == "Pending"

    def listed() -> list[str] | None:
        rows = team.kubectl("get", "gpuquotas", "-n", TEAM).splitlines()
        cells = rows[1].split() if len(rows) > 1 else []
        return cells if cells[:3] == ["team", "1000Mi", "1500Mi"] else None

    cells = wait_for(listed, 30, "kubectl get gpuquotas shows used and hard")
    # cores used 100 (a share that asks for no cores has no SM limit: a whole card's compute),
    # no cores limit (kubectl leaves the cell blank), devices used 1 of 2
    assert cells[3:6] == ["100", "1", "2"], cells
    # Raising the limit lets the pending pod in, without anything else changing.
    team.kubectl(
        "patch", "gpuquota", "team", "-n", TEAM, "--type=merge", "-p", '{"spec":{"hard":{"memory":"2Gi"}}}'
    )
    running(team, "second")
    wait_for(
        lambda: team.get("gpuquota", "team", "-n", TEAM)["status"]["used"]["memory"] == "2000Mi", 30, "used"
    )
    # A third pod waits until one of the others goes.
    team.kubectl("apply", "-f", "-", stdin=json.dumps(team_pod("third")))
    wait_for(lambda: "GpuQuotaExceeded" in team.kubectl("describe", "pod", "third", "-n", TEAM), 60, "held")
    team.kubectl("delete", "pod", "first", "-n", TEAM, "--wait=true", "--timeout=60s")
    running(team, "third")
