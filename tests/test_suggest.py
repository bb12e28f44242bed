"""Did-you-mean (``dra_driver/suggest.py``): the close name, or none; the fields a file may hold."""

from __future__ import annotations

import pytest

from dra_driver.config.model import ConfigError, GpuConfig, parse_gpu_config
from dra_driver.simulate.scenario import ClaimsFile, Scenario
from dra_driver.suggest import closest, did_you_mean, field_names, unknown_field_hint


@pytest.mark.parametrize(
    ("word", "expected"),
    [("memroy", "memory"), ("--outptu", "--output"), ("tpo", "top"), ("zzz", None), ("", None)],
)
def test_closest(word: str, expected: str | None) -> None:
    assert closest(word, ["memory", "cores", "--output", "top", "explain"]) == expected


def test_did_you_mean_says_nothing_without_a_close_name() -> None:
    assert did_you_mean("polcy", ["policy"]) == "; did you mean 'policy'?"
    assert did_you_mean("colour", ["policy", "memory"]) == ""


def test_field_names_follow_lists_optionals_and_aliases() -> None:
    assert "numaNode" in field_names(Scenario, ("nodes", 0, "gpus", 0))
    assert "numa_node" not in field_names(Scenario, ("nodes", 0, "gpus", 0))
    assert set(field_names(Scenario, ("quotas", 1, "hard"))) == {"memory", "cores", "devices"}
    assert "taken" in field_names(Scenario, ("snapshot",))  # SnapshotInfo | None
    assert "nodePolicy" in field_names(ClaimsFile, ("defaults",))
    assert set(field_names(GpuConfig, ("scoringWeights",))) == {"slot", "core", "memory"}
    # Not a model (free keys, a scalar) or not a field: nothing to suggest from.
    assert field_names(Scenario, ("nodes", 0, "gpus", 0, "links")) == []
    assert field_names(Scenario, ("nope",)) == []


def test_unknown_field_hint_reads_pydantic_locations() -> None:
    assert unknown_field_hint(Scenario, ("claims", 0, "memroy")) == "; did you mean 'memory'?"
    assert unknown_field_hint(Scenario, ("claims", 0)) == ""  # an item, not a field name
    assert unknown_field_hint(Scenario, ()) == ""


def test_a_gpu_config_typo_names_the_field_meant() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_gpu_config(
            {"apiVersion": "gpu.hami.io/v1alpha1", "kind": "GpuConfig", "polcy": "spread",
             "scoringWeights": {"cor": 1}}
        )  # fmt: skip
    assert str(raised.value).split("; polcy") == [
        "scoringWeights.cor: unknown field; did you mean 'core'?",
        ": unknown field; did you mean 'policy'?",
    ]
