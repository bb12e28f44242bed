"""One tenant's pod never stops allocation for the others queued with it.

Inputs that reached the engine or the CEL runtime unchecked used to raise out of
``Controller.run_once``, which dropped every pod queued in that pass (and again at every resync).
Each known poison, and an arbitrary unexpected error, now fails its own pod only: it stays gated
and pending with reason ``InvalidRequest`` (or the selector's error), the metric counts it, and
every other pod of the pass is placed. A property test then throws arbitrary annotation values,
GpuConfig documents, quantities and selectors at the planner beside well-formed pods.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.config import ANNOTATION_DEVICE_WEIGHTS, ANNOTATION_GPU_POLICY, ANNOTATION_NODE_POLICY
from dra_driver.kube.api import Obj
from tests.controller.fake_cluster import FakeCluster
from tests.controller.harness import CFG, DRIVER, NS, claim, request

GOOD_PODS = 5
#: A selector the API server accepts (estimated cost ~4e4) whose evaluation exceeds cel-cpp's
#: iteration budget.
COSTLY_LIST = "[" + ", ".join(str(index) for index in range(100)) + "]"
COSTLY_SELECTOR = f"{COSTLY_LIST}.all(x, {COSTLY_LIST}.all(y, x + y >= 0))"


class Queue(FakeCluster):
    """Four (or more) H100s on one node; five well-formed 1Gi pods queue behind the poison."""

    def __init__(self, gpus: int = 4) -> None:
        super().__init__(gpus=gpus)

    def good_pods(self) -> list[str]:
        names = [f"good-{index}" for index in range(GOOD_PODS)]
        for name in names:
            self.pod(name, claim(name, request(memory="1Gi")))
        return names

    def unexpected(self) -> float:
        value = self.controller.metrics.registry.get_sample_value(
            "hami_dra_unexpected_errors_total", {"kind": "Pod"}
        )
        return value or 0.0


def weights(slot: str) -> dict[str, str]:
    return {ANNOTATION_DEVICE_WEIGHTS: f"slot={slot},core=1,memory=1"}


POISONS = {
    "a 401-digit weight (float overflow)": (claim("x", request(memory="1Gi")), weights("1" + "0" * 400)),
    "a 4301-digit weight (int() refuses)": (claim("x", request(memory="1Gi")), weights("9" * 4301)),
    "a selector over cel-cpp's iteration budget": (
        claim("x", request(memory="1Gi", selectors=[COSTLY_SELECTOR])),
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(POISONS))
def test_a_poison_pod_queued_first_leaves_every_other_pod_placed(case: str) -> None:
    queue = Queue()
    claim_body, annotations = POISONS[case]
    queue.pod("poison", claim_body, annotations)  # the oldest: planned first in the pass
    good = queue.good_pods()
    queue.run(2)
    assert [name for name in good if queue.gated(name)] == []
    if annotations is not None:
        # An out-of-range weight is ignored with a warning, like any invalid HAMi annotation.
        assert not queue.gated("poison")
    else:
        condition = queue.condition("poison")
        assert queue.gated("poison") and condition is not None
        # As kube-scheduler reports a selector that fails at runtime: the claim does not fit, and why.
        assert condition["reason"] == "Unschedulable"
        assert (
            "claim default/poison: selector #0: CEL runtime error: Iteration budget exceeded"
            in (condition["message"])
        )


def test_an_unexpected_error_fails_that_pod_alone_with_invalid_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = Queue()
    queue.pod("poison", claim("poison", request(memory="1Gi")))
    good = queue.good_pods()
    planner = queue.controller.allocator.planner
    real_plan = planner.plan

    def plan(pod_view: Any, *args: Any) -> Any:
        if pod_view.name == "poison":
            raise OverflowError("int too large to convert to float")
        return real_plan(pod_view, *args)

    monkeypatch.setattr(planner, "plan", plan)
    queue.run(2)
    assert [name for name in good if queue.gated(name)] == []
    condition = queue.condition("poison")
    assert queue.gated("poison") and condition is not None
    assert condition["reason"] == "InvalidRequest"
    assert condition["message"] == (
        "unexpected error while planning this pod: OverflowError: int too large to convert to float"
    )
    assert queue.unexpected() == 1.0
    assert queue.controller.cache.assumed.in_flight == frozenset()
    # Still pending, not forgotten: the resync plans it again (and reports it once).
    queue.controller._last_resync = 0.0
    queue.run(2)
    assert queue.unexpected() == 2.0 and queue.gated("poison")


def test_a_malformed_informer_event_does_not_drop_the_others() -> None:
    queue = Queue()
    queue.controller._on_change("Pod", None, {"metadata": {"name": "broken", "namespace": NS}, "spec": 7})
    good = queue.good_pods()
    queue.run(2)
    assert [name for name in good if queue.gated(name)] == []
    assert (
        queue.controller.metrics.registry.get_sample_value(
            "hami_dra_unexpected_errors_total", {"kind": "Pod"}
        )
        == 1.0
    ), "counted under the event's kind"


# --- property: arbitrary tenant input beside well-formed pods --------------------------------------

texts = st.text(max_size=60) | st.sampled_from(
    ["mutex", "binpack,numa", "spread", "", "slot=1,core=1,memory=1"]
)
digits = st.integers(min_value=-(10**9), max_value=10**12).map(str) | st.text(
    alphabet="0123456789-+eE.KMGTPiu ", max_size=30
)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)
gpu_config = st.fixed_dictionaries(
    {},
    optional={
        "policy": texts,
        "nodePolicy": texts,
        "scoringWeights": st.dictionaries(st.sampled_from(["slot", "core", "memory", "x"]), json_value),
        "numaBind": json_value,
        "memoryPercent": json_value,
        "extra": json_value,
    },
)
selectors = st.lists(
    st.sampled_from(
        [
            COSTLY_SELECTOR,
            'device.attributes["gpu.hami.io"].index / 0 == 1',
            'device.capacity["gpu.hami.io"].memory.compareTo(quantity("1Gi")) > 0',
            "device.attributes['nope'].x",
            "1 +",
            "'a'",
        ]
    )
    | st.text(max_size=40),
    max_size=2,
)


@st.composite
def poison_pod(draw: st.DrawFn) -> tuple[Obj, dict[str, str]]:
    capacity: dict[str, Any] = {}
    for key in draw(st.sets(st.sampled_from(["memory", "cores", "slots", "bogus"]))):
        capacity[key] = draw(digits)
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if draw(st.booleans()):
        exactly["count"] = draw(st.integers(min_value=-2, max_value=2))
    chosen = draw(selectors)
    if chosen:
        exactly["selectors"] = [{"cel": {"expression": expression}} for expression in chosen]
    body = claim("x")
    body["spec"]["devices"]["requests"] = [{"name": "gpu", "exactly": exactly}]
    if draw(st.booleans()):
        body["spec"]["devices"]["config"] = [
            {"opaque": {"driver": DRIVER, "parameters": {**CFG, **draw(gpu_config)}}}
        ]
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    ANNOTATION_GPU_POLICY,
                    ANNOTATION_NODE_POLICY,
                    ANNOTATION_DEVICE_WEIGHTS,
                    "nvidia.com/use-gputype",
                ]
            ),
            texts | digits.map(lambda value: f"slot={value},core=1,memory=1"),
        )
    )
    return body, annotations


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(poisons=st.lists(poison_pod(), min_size=1, max_size=2))
def test_arbitrary_tenant_input_never_keeps_well_formed_pods_from_being_placed(
    poisons: list[tuple[Obj, dict[str, str]]],
) -> None:
    queue = Queue(gpus=6)
    for index, (claim_body, pod_annotations) in enumerate(poisons):
        queue.pod(f"poison-{index}", claim_body, pod_annotations)
    good = queue.good_pods()
    queue.run(2)
    assert [name for name in good if queue.gated(name)] == []
    for index in range(len(poisons)):
        name = f"poison-{index}"
        condition = queue.condition(name)
        # Each poison pod is either placed or pending with a reason, never silently dropped.
        assert not queue.gated(name) or (condition is not None and condition["status"] == "False"), name
