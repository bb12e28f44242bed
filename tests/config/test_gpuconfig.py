"""GpuConfig validation, resolution precedence and the committed JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from dra_driver.config import (
    ANNOTATION_DEVICE_WEIGHTS,
    ANNOTATION_GPU_POLICY,
    ANNOTATION_NODE_POLICY,
    ConfigError,
    ConfigSource,
    ControllerDefaults,
    parse_gpu_config,
    resolve_config,
)
from dra_driver.config.resolve import (
    ANNOTATION_NUMA_BIND,
    PodAnnotations,
    applies_to,
    driver_configs,
    read_pod_annotations,
)
from dra_driver.config.schema import render_schema
from dra_driver.engine import NodePolicy, Policy, ScoringWeights, parse_policy_chain

ROOT = Path(__file__).resolve().parents[2]
HEAD = {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig"}


def cfg(**fields: object) -> dict[str, object]:
    return {**HEAD, **fields}


def test_full_config_parses() -> None:
    config = parse_gpu_config(
        cfg(policy="mutex,binpack", nodePolicy="spread", scoringWeights={"memory": 3}, numaBind=True)
    )
    assert config.policy == "mutex,binpack"
    assert config.nodePolicy == "spread"
    assert config.scoringWeights is not None
    assert config.scoringWeights.to_engine() == ScoringWeights(slot=1, core=1, memory=3)
    assert config.numaBind is True


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (cfg(policy="mutex,bnpack"), "policy: unknown policy name(s) 'bnpack'"),
        (cfg(policy=" , "), "policy: must name at least one policy"),
        (cfg(nodePolicy="packed"), "nodePolicy: Input should be 'binpack' or 'spread', got 'packed'"),
        (cfg(numaBind="true"), "numaBind: Input should be a valid boolean"),
        (cfg(scoringWeights={"slot": -1}), "scoringWeights.slot: Input should be greater than or equal to 0"),
        (cfg(scoringWeights={"slot": 0, "core": 0, "memory": 0}), "scoringWeights: at least one"),
        (
            cfg(scoringWeights={"core": 10**400}),
            "scoringWeights.core: Input should be less than or equal to 1000000",
        ),
        (cfg(scoringWeights={"gpu": 1}), "scoringWeights.gpu: unknown field"),
        (cfg(polcy="binpack"), "polcy: unknown field"),
        ({"apiVersion": "gpu.hami.io/v1", "kind": "GpuConfig"}, "apiVersion: Input should be"),
        ({"apiVersion": "gpu.hami.io/v1alpha1"}, "kind: Field required"),
        ("binpack", "parameters must be an object"),
    ],
)
def test_invalid_configs_name_the_field(data: object, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_gpu_config(data)
    assert expected in str(err.value)


def test_lenient_parse_keeps_unknown_policy_names_for_warnings() -> None:
    config = parse_gpu_config(cfg(policy="mutex,gang,binpack"), lenient_policy=True)
    assert config.unknown_policies() == ("gang",)


def test_applies_to_request_and_subrequest() -> None:
    assert applies_to(None, "gpu")
    assert applies_to(["gpu"], "gpu/big")
    assert applies_to(["gpu/big"], "gpu/big")
    assert not applies_to(["gpu/small"], "gpu/big")
    assert not applies_to(["other"], "gpu")


def test_driver_configs_skip_other_drivers_and_requests() -> None:
    entries = [
        {"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
        {"requests": ["b"], "opaque": {"driver": "gpu.hami.io", "parameters": cfg(policy="spread")}},
        {"requests": ["a"], "opaque": {"driver": "gpu.hami.io", "parameters": cfg(policy="binpack")}},
    ]
    configs = driver_configs(entries, driver="gpu.hami.io", request="a", where="claim ns/c")
    assert [config.policy for config in configs] == ["binpack"]


def test_driver_configs_error_names_object_and_index() -> None:
    entries = [{"opaque": {"driver": "gpu.hami.io", "parameters": cfg(numaBind=1)}}]
    with pytest.raises(ConfigError, match=r"DeviceClass gpu config\[0\]: numaBind"):
        driver_configs(entries, driver="gpu.hami.io", request=None, where="DeviceClass gpu")


def test_precedence_annotation_over_claim_over_class_over_default() -> None:
    klass = [parse_gpu_config(cfg(policy="mutex,binpack", numaBind=True, nodePolicy="spread"))]
    claim = [parse_gpu_config(cfg(policy="spread,numa", nodePolicy="binpack"))]
    resolved = resolve_config(class_configs=klass, claim_configs=claim)
    assert resolved.policy.policies == (Policy.SPREAD, Policy.NUMA)
    assert resolved.sources["policy"] is ConfigSource.CLAIM
    assert resolved.numa_bind is True and resolved.sources["numaBind"] is ConfigSource.CLASS
    assert resolved.node_policy is NodePolicy.BINPACK

    annotated = resolve_config(
        class_configs=klass,
        claim_configs=claim,
        annotations={
            ANNOTATION_GPU_POLICY: "binpack",
            ANNOTATION_NODE_POLICY: "spread",
            ANNOTATION_DEVICE_WEIGHTS: "slot=0,core=1,memory=2",
        },
    )
    assert annotated.policy.policies == (Policy.BINPACK,)
    assert annotated.node_policy is NodePolicy.SPREAD
    assert annotated.weights == ScoringWeights(slot=0, core=1, memory=2)
    assert "policy=binpack(annotation)" in annotated.describe()


def test_defaults_apply_when_nothing_is_set() -> None:
    resolved = resolve_config(defaults=ControllerDefaults(policy="binpack", node_policy="spread"))
    assert resolved.policy.policies == (Policy.BINPACK,)
    assert resolved.node_policy is NodePolicy.SPREAD
    assert resolved.numa_bind is False
    assert "policy=binpack(default)" in resolved.describe()


def test_later_entries_override_earlier_ones() -> None:
    configs = [parse_gpu_config(cfg(policy="binpack")), parse_gpu_config(cfg(policy="spread"))]
    assert resolve_config(claim_configs=configs).policy.policies == (Policy.SPREAD,)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({ANNOTATION_NODE_POLICY: "pack"}, "hami.io/node-scheduler-policy ignored: unknown node policy"),
        (
            {ANNOTATION_DEVICE_WEIGHTS: "slot=1"},
            "hami.io/device-scoring-weights ignored: invalid scoring weights",
        ),
    ],
)
def test_bad_annotations_are_ignored_with_the_reason_like_unknown_policy_names(
    annotations: dict[str, str], expected: str
) -> None:
    class_config = parse_gpu_config(
        cfg(nodePolicy="spread", scoringWeights={"slot": 0, "core": 1, "memory": 2})
    )
    resolved = resolve_config(class_configs=[class_config], annotations=annotations)
    (reason,) = resolved.ignored_annotations
    assert reason.startswith(f"pod annotation {expected}")
    assert resolved.node_policy == NodePolicy.SPREAD
    assert resolved.weights == class_config.scoringWeights.to_engine()  # type: ignore[union-attr]
    assert "annotation" not in resolved.describe()


@pytest.mark.parametrize(
    ("annotations", "parsed", "warning"),
    [
        ({}, PodAnnotations(), None),
        (
            {ANNOTATION_GPU_POLICY: "mutex,gang", ANNOTATION_NODE_POLICY: "spread"},
            PodAnnotations(policy=parse_policy_chain("mutex,gang"), node_policy=NodePolicy.SPREAD),
            "pod annotation hami.io/gpu-scheduler-policy: unknown policy name(s) ignored: gang",
        ),
        (
            {ANNOTATION_DEVICE_WEIGHTS: "slot=0,core=1,memory=2", ANNOTATION_NUMA_BIND: " True "},
            PodAnnotations(weights=ScoringWeights(slot=0, core=1, memory=2), numa_bind=True),
            None,
        ),
        ({ANNOTATION_NODE_POLICY: "pack"}, None, "pod annotation hami.io/node-scheduler-policy ignored: "),
        (
            {ANNOTATION_DEVICE_WEIGHTS: "slot=1"},
            None,
            "pod annotation hami.io/device-scoring-weights ignored: ",
        ),
        (
            {ANNOTATION_NUMA_BIND: "yes"},
            None,
            "pod annotation nvidia.com/numa-bind ignored: not true or false",
        ),
    ],
)
def test_pod_annotations_are_parsed_once_for_the_webhook_and_the_resolver(
    annotations: dict[str, str], parsed: PodAnnotations | None, warning: str | None
) -> None:
    """The webhook warns with ``warnings()``; the resolver applies the values and reports ``ignored``."""
    pod = read_pod_annotations(annotations)
    if parsed is not None:
        assert pod == parsed
    else:  # invalid: ignored, with the reason
        assert pod == PodAnnotations(ignored=pod.ignored) and len(pod.ignored) == 1
    warnings = pod.warnings()
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith(warning)


def test_bad_controller_defaults_rejected() -> None:
    with pytest.raises(ConfigError):
        ControllerDefaults(policy="nonsense")
    with pytest.raises(ConfigError):
        ControllerDefaults(node_policy="random")


def test_committed_schema_is_current() -> None:
    committed = (ROOT / "api" / "gpuconfig.schema.json").read_text()
    assert committed == render_schema(), "api/gpuconfig.schema.json is stale: run hack/gen-schema.py"
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen-schema.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_schema_agrees_with_model_on_examples() -> None:
    schema = json.loads((ROOT / "api" / "gpuconfig.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    good = cfg(policy="mutex,binpack", nodePolicy="spread", scoringWeights={"slot": 2}, numaBind=False)
    assert not list(validator.iter_errors(good))
    parse_gpu_config(good)
    for bad in (cfg(extra=1), cfg(numaBind="yes"), cfg(scoringWeights={"core": -1}), {"kind": "GpuConfig"}):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(ConfigError):
            parse_gpu_config(bad)


def test_only_a_device_class_can_accept_unenforced_shares() -> None:
    """A tenant's claim config must not opt its own shares onto GPUs that cannot enforce them."""
    opt_in = parse_gpu_config({**HEAD, "allowUnenforcedShares": True})
    assert resolve_config(class_configs=[opt_in]).unenforced_shares
    assert not resolve_config(claim_configs=[opt_in]).unenforced_shares
    assert not resolve_config().unenforced_shares
