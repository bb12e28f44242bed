"""``FakeKube``'s patches (tests/controller/fake_patch.py): the rules one by one, then side by side
with the real kube-apiserver (the shared tier) on the patches our controller sends a pod."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from dra_driver.kube.api import PODS, Kube
from dra_driver.kube.errors import KubeError
from dra_driver.resource.edits import condition_patch, gate_patch
from dra_driver.resource.objects import PodView
from tests.controller.fake_kube import FakeKube
from tests.controller.fake_patch import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

DOC = {
    "metadata": {"name": "p", "annotations": {"a": "1"}},
    "spec": {"gates": [{"name": "x"}, {"name": "y"}]},
}


def refused(call: Any, *args: Any) -> int:
    with pytest.raises(KubeError) as failed:
        call(*args)
    return failed.value.status


def test_a_merge_patch_merges_maps_removes_nulls_and_replaces_the_rest() -> None:
    patched = merge_patch(DOC, {"metadata": {"annotations": {"a": None, "b": "2"}}, "spec": {"gates": []}})
    assert patched == {"metadata": {"name": "p", "annotations": {"b": "2"}}, "spec": {"gates": []}}
    assert DOC["metadata"]["annotations"] == {"a": "1"}, "the target is left as it was"
    assert merge_patch(DOC, ["whole"]) == ["whole"] and merge_patch("x", {"k": {"n": 1}}) == {"k": {"n": 1}}


def test_json_patch_operations() -> None:
    ops = [
        {"op": "add", "path": "/metadata/annotations/b~1c", "value": "2"},
        {"op": "add", "path": "/spec/gates/1", "value": {"name": "mid"}},
        {"op": "add", "path": "/spec/gates/-", "value": {"name": "end"}},
        {"op": "replace", "path": "/metadata/name", "value": "q"},
        {"op": "remove", "path": "/spec/gates/0"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/copied"},
        {"op": "move", "from": "/metadata/copied", "path": "/metadata/moved"},
        {"op": "test", "path": "/metadata/moved", "value": "q"},
    ]
    assert json_patch(DOC, ops) == {
        "metadata": {"name": "q", "annotations": {"a": "1", "b/c": "2"}, "moved": "q"},
        "spec": {"gates": [{"name": "mid"}, {"name": "y"}, {"name": "end"}]},
    }
    assert json_patch(DOC, [{"op": "add", "path": "/spec/gates/2", "value": 1}])["spec"]["gates"][2] == 1
    assert json_patch(DOC, [{"op": "add", "path": "", "value": {"new": 1}}]) == {"new": 1}
    assert DOC["spec"]["gates"] == [{"name": "x"}, {"name": "y"}]


def test_a_test_of_null_passes_on_a_missing_member_and_fails_on_a_present_one() -> None:
    assert json_patch(DOC, [{"op": "test", "path": "/metadata/labels", "value": None}]) == DOC
    assert refused(json_patch, DOC, [{"op": "test", "path": "/metadata/name", "value": None}]) == 422
    assert refused(json_patch, DOC, [{"op": "test", "path": "/nothing/here", "value": None}]) == 422
    assert refused(json_patch, DOC, [{"op": "test", "path": "/spec/gates/5", "value": None}]) == 422


@pytest.mark.parametrize(
    "op",
    [
        {"op": "test", "path": "/metadata/name", "value": "other"},
        {"op": "remove", "path": "/metadata/labels"},
        {"op": "remove", "path": "/spec/gates/2"},
        {"op": "replace", "path": "/metadata/labels", "value": {}},
        {"op": "replace", "path": "/spec/gates/2", "value": {}},
        {"op": "add", "path": "/spec/gates/3", "value": {}},
        {"op": "add", "path": "/missing/key", "value": 1},
        {"op": "add", "path": "/metadata/name/x", "value": 1},
        {"op": "move", "from": "/metadata/labels", "path": "/metadata/x"},
    ],
)
def test_a_json_patch_op_that_does_not_apply_is_422_and_writes_nothing(op: dict[str, Any]) -> None:
    before = copy.deepcopy(DOC)
    assert refused(json_patch, DOC, [{"op": "add", "path": "/metadata/x", "value": 1}, op]) == 422
    assert before == DOC


@pytest.mark.parametrize(
    "ops",
    [
        {"op": "add"},
        [{"op": "add", "value": 1}],
        [{"path": "/a"}],
        ["add"],
        [{"op": "frobnicate", "path": "/a"}],
        [{"op": "add", "path": "a", "value": 1}],
        [{"op": "remove", "path": ""}],
    ],
)
def test_a_malformed_json_patch_is_400(ops: Any) -> None:
    assert refused(json_patch, DOC, ops) == 400


def test_a_strategic_merge_patch_merges_lists_with_a_merge_key_by_it() -> None:
    pod = {
        "metadata": {"finalizers": ["a"], "annotations": {"k": "v"}},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Ours", "status": "False", "reason": "r"},
            ],
            "hostIPs": [{"ip": "10.0.0.1"}],
        },
    }
    patch = {
        "metadata": {"finalizers": ["b", "a"], "annotations": {"k": None}},
        "status": {
            "conditions": [{"type": "Ours", "status": "True"}, {"type": "New", "status": "True"}],
            "hostIPs": [{"ip": "10.0.0.2"}],
            "phase": "Running",
        },
    }
    assert strategic_merge_patch(pod, patch) == {
        "metadata": {"finalizers": ["a", "b"], "annotations": {}},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Ours", "status": "True", "reason": "r"},
                {"type": "New", "status": "True"},
            ],
            "hostIPs": [{"ip": "10.0.0.2"}],  # no merge key: replaced whole
            "phase": "Running",
        },
    }
    new_first = strategic_merge_patch(pod, {"status": {"conditions": [{"type": "New"}, {"type": "Ready"}]}})
    assert [c["type"] for c in new_first["status"]["conditions"]] == ["New", "Ready", "Ours"]
    assert strategic_merge_patch(pod, {"status": {"conditions": ["x"]}})["status"]["conditions"] == ["x"]
    assert strategic_merge_patch(pod, ["whole"]) == ["whole"]
    assert strategic_merge_patch(None, {"status": {"conditions": [{"type": "A"}]}}) == {
        "status": {"conditions": [{"type": "A"}]}
    }
    assert pod["status"]["conditions"][1] == {"type": "Ours", "status": "False", "reason": "r"}


def test_a_strategic_directive_is_refused_rather_than_applied_wrongly() -> None:
    with pytest.raises(ValueError, match=r"\$patch"):
        strategic_merge_patch({"spec": {}}, {"spec": {"$patch": "replace"}})


def test_the_content_type_chooses_the_kind_and_another_is_415() -> None:
    target = {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "B"}]}}
    patch = {"status": {"conditions": [{"type": "A", "status": "True"}]}}
    merged = apply_patch(f"{STRATEGIC_PATCH}; charset=utf-8", target, patch)
    assert merged["status"]["conditions"] == [{"type": "A", "status": "True"}, {"type": "B"}]
    assert apply_patch(MERGE_PATCH, target, patch) == patch
    ops = [{"op": "remove", "path": "/status"}]
    assert apply_patch(JSON_PATCH, target, ops) == {}
    assert refused(apply_patch, "application/apply-patch+yaml", target, patch) == 415


# --- side by side with kube-apiserver ----------------------------------------------------------

OTHER_GATE = "example.com/other"
GATE = "example.com/ours"


class SideBySide:
    """One pod on the real server and its copy in a ``FakeKube``: every patch goes to both."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        body = {
            "metadata": {"name": "patched"},
            "spec": {
                "schedulingGates": [{"name": OTHER_GATE}, {"name": GATE}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        self.pod = kube.create(PODS, namespace, body)
        self.fake = FakeKube()
        self.fake.objects[("pods", namespace, "patched")] = copy.deepcopy(self.pod)

    def patch(self, patch: Any, *, status: bool = False, strategic: bool = False) -> Any:
        """What both made of ``patch``: the same, or the test fails."""
        answers = []
        for api in (self.kube, self.fake):
            try:
                written = api.patch(
                    PODS, self.namespace, "patched", patch, status=status, strategic=strategic
                )
            except KubeError as err:
                answers.append(err.status)
            else:
                answers.append(_seen(written))
        real, fake = answers
        assert fake == real, f"the fake answered {fake}, kube-apiserver {real}"
        return real


def _seen(pod: dict[str, Any]) -> dict[str, Any]:
    """What a patch of ours changes: annotations, gates, conditions (the server's timestamps kept)."""
    return {
        "annotations": pod["metadata"].get("annotations"),
        "gates": [g["name"] for g in pod["spec"].get("schedulingGates") or ()],
        "conditions": [
            (c["type"], c["status"], c.get("reason"), c.get("message"), c.get("lastTransitionTime"))
            for c in (pod.get("status") or {}).get("conditions") or ()
        ],
    }


@pytest.fixture
def pods(api_kube: Kube, api_namespace: str) -> SideBySide:
    return SideBySide(api_kube, api_namespace)


def test_the_gate_patch_is_applied_and_refused_alike(pods: SideBySide) -> None:
    view = PodView.parse(pods.pod)
    stale = gate_patch(view, {"gpu.hami.io/decision": "d"}, GATE)
    assert pods.patch({"metadata": {"annotations": {"someone/else": "1"}}})["annotations"] == {
        "someone/else": "1"
    }
    assert pods.patch(stale) == 422  # our copy had no annotations: the test of null fails
    other = {**pods.pod, "metadata": {**pods.pod["metadata"], "uid": str(uuid.uuid4())}}
    assert pods.patch(gate_patch(PodView.parse(other), {"x/y": "z"}, GATE)) == 422
    moved = {**pods.pod, "spec": {**pods.pod["spec"], "schedulingGates": [{"name": GATE}]}}
    assert pods.patch(gate_patch(PodView.parse(moved), {"x/y": "z"}, GATE)) == 422
    assert pods.patch([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "x/y"}}]) == 422
    current = PodView.parse(pods.kube.get(PODS, pods.namespace, "patched"))
    written = pods.patch(gate_patch(current, {"gpu.hami.io/decision": "d"}, GATE))
    assert written["gates"] == [OTHER_GATE]
    assert written["annotations"] == {"someone/else": "1", "gpu.hami.io/decision": "d"}
    assert pods.patch({"metadata": {"annotations": {"someone/else": None}}})["annotations"] == {
        "gpu.hami.io/decision": "d"
    }


def test_the_gate_patch_of_a_pod_without_annotations_adds_them_as_a_map(pods: SideBySide) -> None:
    ops = gate_patch(PodView.parse(pods.pod), {"gpu.hami.io/decision": "d", "example.com/x": "x"}, GATE)
    written = pods.patch(ops)
    assert written["gates"] == [OTHER_GATE]
    assert written["annotations"] == {"gpu.hami.io/decision": "d", "example.com/x": "x"}


def test_the_condition_patch_merges_by_type_and_a_namesake_refuses_it(pods: SideBySide) -> None:
    view = PodView.parse(pods.pod)
    first = condition_patch(view, "False", "Unschedulable", "no", "2026-12-06T00:00:00Z")
    assert len(pods.patch(first, status=True, strategic=True)["conditions"]) >= 1
    pods.patch({"status": {"conditions": [{"type": "example.com/Other", "status": "True"}]}}, status=True,
               strategic=True)  # fmt: skip
    second = condition_patch(view, "True", "Allocated", "ok", "2026-12-06T00:00:01Z")
    conditions = pods.patch(second, status=True, strategic=True)["conditions"]
    assert [c[0] for c in conditions].count("example.com/Other") == 1
    other = PodView.parse({**pods.pod, "metadata": {**pods.pod["metadata"], "uid": str(uuid.uuid4())}})
    assert pods.patch(condition_patch(other, "False", "X", "y", "2026-12-06T00:00:02Z"), status=True,
                      strategic=True) == 422  # fmt: skip
