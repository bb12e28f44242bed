"""Every object the chart renders, for every values combination, is valid for Kubernetes 1.34 and 1.37
(kubernetes-validate --strict through tests/kube_validate.py), and so are the example manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.combos import COMBOS
from tests.chart.helpers import ALL_ON, CHART, EXAMPLES, HelmError, Render, run_helm
from tests.kube_validate import assert_valid

#: Kinds from CRDs that kubernetes-validate has no schema for; checked by hand below.
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}


def _check_cert_manager(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] == "cert-manager.io/v1"
    spec = obj["spec"]
    if obj["kind"] == "Issuer":
        assert spec == {"selfSigned": {}}
    else:
        assert set(spec) >= {"secretName", "dnsNames", "issuerRef"}
        assert spec["issuerRef"]["name"]
        assert all(name.startswith("t-hami-dra-webhook") for name in spec["dnsNames"])


@pytest.mark.parametrize("kube_version", ["1.34.0", "1.37.0"])
@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_rendered_objects_are_valid(render: Render, combo: str, kube_version: str) -> None:
    values, all_on = COMBOS[combo]
    objects = render(values=values, values_file=ALL_ON if all_on else None, kube_version=kube_version)
    assert objects, "nothing rendered"
    major_minor = kube_version.rsplit(".", 1)[0]
    for obj in objects:
        if obj["kind"] in CERT_MANAGER_KINDS:
            _check_cert_manager(obj)
        else:
            assert_valid(obj, versions=(major_minor,))
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "duplicate objects rendered"


def test_kubernetes_older_than_1_34_is_refused(helm: str) -> None:
    with pytest.raises(HelmError, match="kubeVersion"):
        run_helm(helm, "template", "t", str(CHART), "--kube-version", "1.33.0")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: Path(p).name)
def test_examples_are_valid(path: Path) -> None:
    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert {o["kind"] for o in objects} >= {"ResourceClaimTemplate", "Pod"}
    for obj in objects:
        assert_valid(obj)
