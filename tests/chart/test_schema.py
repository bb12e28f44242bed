"""values.schema.json rejects bad values before anything is rendered, naming the offending key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.helpers import CHART, HelmError, Render

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicaCount": 2}, "replicaCount"),
    ("unknown nested key", {"kubeletPlugin": {"gpuCount": 4}}, "gpuCount"),
    ("source", {"kubeletPlugin": {"source": "rocm"}}, "/kubeletPlugin/source"),
    ("profile", {"kubeletPlugin": {"simulated": {"profile": "v100"}}}, "/kubeletPlugin/simulated/profile"),
    ("unknown policy", {"controller": {"defaultPolicy": "mutex,fastest"}}, "/controller/defaultPolicy"),
    ("node policy", {"controller": {"defaultNodePolicy": "numa"}}, "/controller/defaultNodePolicy"),
    ("class policy", {"deviceClasses": [{"name": "x.gpu.hami.io", "config": {"policy": "pack"}}]}, "policy"),
    (
        "negative weight",
        {"deviceClasses": [{"name": "x.gpu.hami.io", "config": {"scoringWeights": {"memory": -1}}}]},
        "scoringWeights/memory",
    ),
    (
        "numaBind type",
        {"deviceClasses": [{"name": "x.gpu.hami.io", "config": {"numaBind": "yes"}}]},
        "numaBind",
    ),
    ("class name", {"deviceClasses": [{"name": "GPU_Class"}]}, "/deviceClasses/0/name"),
    ("cert mode", {"webhook": {"certificate": {"mode": "letsencrypt"}}}, "/webhook/certificate/mode"),
    ("failure policy", {"webhook": {"failurePolicy": "Retry"}}, "/webhook/failurePolicy"),
    ("privileged", {"kubeletPlugin": {"privileged": "yes"}}, "/kubeletPlugin/privileged"),
    ("driver name", {"driverName": "GPU.HAMI.IO"}, "/driverName"),
    ("relative path", {"kubeletPlugin": {"cdiDir": "var/run/cdi"}}, "/kubeletPlugin/cdiDir"),
]


@pytest.mark.parametrize(
    ("values", "where"), [(v, w) for _, v, w in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_schema_rejects(render: Render, values: dict[str, Any], where: str) -> None:
    with pytest.raises(HelmError) as caught:
        render(values=values)
    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert where in str(caught.value)


def test_schema_accepts_chains_with_spaces(render: Render) -> None:
    render(values={"controller": {"defaultPolicy": " mutex , binpack,numa "}})


def test_schema_is_strict_at_every_level() -> None:
    """Every object in the schema either forbids unknown keys or is a free-form Kubernetes field."""
    free_form = {"global", "affinity", "namespaceSelector", "tolerations", "extraEnv", "extraVolumes",
                 "extraVolumeMounts", "claims", "requests", "limits", "nodeSelector", "podAnnotations",
                 "commonLabels"}  # fmt: skip
    schema = json.loads((CHART / "values.schema.json").read_text())
    loose: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        strict = node.get("type") != "object" or "additionalProperties" in node
        if not strict and path.rsplit("/", 1)[-1].removesuffix("[]") not in free_form:
            loose.append(path)
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}/{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "")
    assert schema["additionalProperties"] is False
    assert not loose, f"objects accepting any key: {loose}"
