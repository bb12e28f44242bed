"""The pod queue's memory of its pending reports: what it reports when, and the metric groups."""

from __future__ import annotations

from dra_driver.controller.metrics import PendingGroup, created_epoch
from dra_driver.controller.pending import PendingReports, Report
from dra_driver.controller.reasons import Reason
from dra_driver.resource.objects import PodView


def pod(uid: str, created: str = "2026-01-01T00:00:00Z") -> PodView:
    return PodView({"metadata": {"name": uid, "namespace": "ns", "uid": uid, "creationTimestamp": created}})


def test_a_new_message_is_reported_with_its_reason_and_message() -> None:
    reports = PendingReports()
    assert reports.record(pod("a"), Reason.UNSCHEDULABLE, "no GPU") == Report(
        "Unschedulable", "no GPU", "Unschedulable"
    )
    assert reports.record(pod("a"), Reason.UNSCHEDULABLE, "no GPU") is None
    assert reports.record(pod("a"), Reason.QUOTA_EXCEEDED, "0/2 CardInsufficientMemory, 1/2 Other") == Report(
        "GpuQuotaExceeded", "0/2 CardInsufficientMemory, 1/2 Other", "CardInsufficientMemory"
    )


def test_forgetting_a_pod_never_reported_is_a_no_op() -> None:
    reports = PendingReports()
    reports.forget("never-seen")
    assert "never-seen" not in reports and reports.reason("never-seen") is None


def test_clear_says_whether_the_pod_was_pending() -> None:
    reports = PendingReports()
    reports.record(pod("a"), Reason.UNSCHEDULABLE, "m")
    assert reports.clear("a") is True
    assert "a" not in reports
    assert reports.clear("a") is False


def test_forget_drops_the_reports_and_the_warnings_even_when_never_warned() -> None:
    reports = PendingReports()
    reports.record(pod("a"), Reason.UNSCHEDULABLE, "m")
    reports.forget("a")
    assert "a" not in reports
    reports.record(pod("b"), Reason.UNSCHEDULABLE, "m")
    assert reports.new_warnings("b", ["w"]) == ["w"]
    reports.forget("b")
    assert reports.new_warnings("b", ["w"]) == ["w"]


def test_groups_count_pods_per_reason_with_the_oldest_creation() -> None:
    reports = PendingReports()
    pods = {
        "a": pod("a", "2026-01-02T00:00:00Z"),
        "b": pod("b", "2026-01-01T00:00:00Z"),
        "c": pod("c", "2026-01-03T00:00:00Z"),
        "d": pod("d", "not a time"),
    }
    for uid in ("a", "b", "c"):
        reports.record(pods[uid], "Unschedulable", "m")
    reports.record(pods["d"], "GpuQuotaExceeded", "q")
    reports.record(pod("gone"), Reason.QUOTA_EXCEEDED, "q")
    groups = reports.groups(pods.get)
    assert groups == {
        "Unschedulable": PendingGroup(3, created_epoch("2026-01-01T00:00:00Z")),
        "GpuQuotaExceeded": PendingGroup(2, None),
    }


def test_groups_look_up_each_pending_pod_by_its_uid() -> None:
    reports = PendingReports()
    reports.record(pod("a"), Reason.UNSCHEDULABLE, "m")
    asked: list[str] = []

    def lookup(uid: str) -> PodView | None:
        asked.append(uid)
        return pod(uid, "2026-01-05T00:00:00Z")

    assert reports.groups(lookup) == {"Unschedulable": PendingGroup(1, created_epoch("2026-01-05T00:00:00Z"))}
    assert asked == ["a"]
