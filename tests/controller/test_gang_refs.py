"""Which gang a pod names and what its group object asks (dra_driver/controller/gang_refs.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.gang_refs import (
    COSCHEDULING,
    COSCHEDULING_POD_GROUPS,
    MIN_MEMBERS_ANNOTATION,
    POD_GROUP,
    POD_GROUP_LABEL,
    POD_GROUPS_V1ALPHA2,
    POD_GROUPS_V1ALPHA3,
    WORKLOAD,
    WORKLOADS_V1ALPHA1,
    GangPolicy,
    GroupDirectory,
    GroupRef,
    event_kind,
    group_of,
)
from dra_driver.controller.slim import keep_pod


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "w-0", "namespace": "team"}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"containers": [{"name": "main"}], **spec}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (pod(), None),
        (pod({"app": "x"}), None),
        (pod({POD_GROUP_LABEL: "train"}), GroupRef(COSCHEDULING, "team", "train")),
        (pod(schedulingGroup={"podGroupName": "pg"}), GroupRef(POD_GROUP, "team", "pg")),
        (pod(workloadRef={"name": "job", "podGroup": "w"}), GroupRef(WORKLOAD, "team", "job", "w")),
        (
            pod(workloadRef={"name": "job", "podGroup": "w", "podGroupReplicaKey": "1"}),
            GroupRef(WORKLOAD, "team", "job", "w", "1"),
        ),
        # kube-scheduler's own field wins over the coscheduling label
        (
            pod({POD_GROUP_LABEL: "train"}, schedulingGroup={"podGroupName": "pg"}),
            GroupRef(POD_GROUP, "team", "pg"),
        ),
    ],
)
def test_the_group_a_pod_names(obj: dict[str, Any], expected: GroupRef | None) -> None:
    assert group_of(obj) == expected
    # What the controller's informer keeps of the pod (ours, or a neighbour) still names it.
    assert group_of(keep_pod(obj)) == expected
    with_claim = {
        **obj,
        "spec": {**obj["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
    }
    assert group_of(keep_pod(with_claim)) == expected


def directory_with(resource: Any, name: str, spec: dict[str, Any]) -> GroupDirectory:
    directory = GroupDirectory()
    obj = {"metadata": {"name": name, "namespace": "team"}, "spec": spec}
    directory.apply(event_kind(resource), None, obj)
    return directory


COSCHEDULED = GroupRef(COSCHEDULING, "team", "train")


@pytest.mark.parametrize(
    ("directory", "ref", "annotations", "expected"),
    [
        (directory_with(COSCHEDULING_POD_GROUPS, "train", {"minMember": 4}), COSCHEDULED, {}, GangPolicy(4)),
        (
            directory_with(COSCHEDULING_POD_GROUPS, "train", {"minMember": 4, "scheduleTimeoutSeconds": 9}),
            COSCHEDULED,
            {MIN_MEMBERS_ANNOTATION: "2"},  # the PodGroup wins
            GangPolicy(4, 9.0),
        ),
        (GroupDirectory(), COSCHEDULED, {MIN_MEMBERS_ANNOTATION: "3"}, GangPolicy(3)),
        (
            directory_with(POD_GROUPS_V1ALPHA2, "pg", {"schedulingPolicy": {"gang": {"minCount": 5}}}),
            GroupRef(POD_GROUP, "team", "pg"),
            {},
            GangPolicy(5),
        ),
        (
            directory_with(POD_GROUPS_V1ALPHA3, "pg", {"schedulingPolicy": {"basic": {}}}),
            GroupRef(POD_GROUP, "team", "pg"),
            {},
            GangPolicy(None),
        ),
        (
            directory_with(
                WORKLOADS_V1ALPHA1, "job", {"podGroups": [{"name": "w", "policy": {"gang": {"minCount": 2}}}]}
            ),
            GroupRef(WORKLOAD, "team", "job", "w", "0"),
            {},
            GangPolicy(2),
        ),
    ],
)
def test_what_a_group_asks(
    directory: GroupDirectory, ref: GroupRef, annotations: dict[str, str], expected: GangPolicy
) -> None:
    assert directory.policy(ref, annotations) == expected


@pytest.mark.parametrize(
    ("directory", "ref", "annotations", "problem"),
    [
        (GroupDirectory(), COSCHEDULED, {}, "PodGroup team/train (scheduling.x-k8s.io/v1alpha1) not found"),
        (GroupDirectory(), COSCHEDULED, {MIN_MEMBERS_ANNOTATION: "four"}, "is not a positive integer"),
        (GroupDirectory(), COSCHEDULED, {MIN_MEMBERS_ANNOTATION: "0"}, "is not a positive integer"),
        (
            GroupDirectory(),
            GroupRef(POD_GROUP, "team", "pg"),
            {},
            "PodGroup team/pg (scheduling.k8s.io) does not exist",
        ),
        (
            directory_with(WORKLOADS_V1ALPHA1, "job", {"podGroups": []}),
            GroupRef(WORKLOAD, "team", "job", "w"),
            {},
            "Workload team/job has no pod group w",
        ),
    ],
)
def test_a_group_whose_minimum_is_not_known_says_why(
    directory: GroupDirectory, ref: GroupRef, annotations: dict[str, str], problem: str
) -> None:
    policy = directory.policy(ref, annotations)
    assert policy.min_members is None and policy.problem is not None and problem in policy.problem


def test_a_deleted_group_object_is_forgotten_and_its_change_noted() -> None:
    directory = directory_with(COSCHEDULING_POD_GROUPS, "train", {"minMember": 4})
    assert directory.take_changed() == {("team", "train")} and directory.take_changed() == set()
    obj = {"metadata": {"name": "train", "namespace": "team"}, "spec": {"minMember": 4}}
    directory.apply(event_kind(COSCHEDULING_POD_GROUPS), obj, None)
    assert directory.policy(COSCHEDULED, {}).problem is not None
    assert directory.take_changed() == {("team", "train")}
