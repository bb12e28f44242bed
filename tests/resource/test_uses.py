"""What an allocated claim takes from our devices (dra_driver/resource/uses.py): one ``Use`` per
result of our driver, with the claim's namespace and the result's DeviceClass for quotas."""

from __future__ import annotations

from typing import Any

from dra_driver.contract import DeviceId
from dra_driver.resource.capacity import WHOLE_DEVICE, Consumption
from dra_driver.resource.uses import Use, claim_uses, request_classes

DRIVER = "gpu.hami.io"


def allocated(
    requests: list[dict[str, Any]], results: list[dict[str, Any]], namespace: str | None = "team-a"
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "c"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "metadata": metadata,
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def result(request: str | None = "gpu", **fields: Any) -> dict[str, Any]:
    entry = {"driver": DRIVER, "pool": "node-1", "device": "gpu-0", **fields}
    if request is not None:
        entry["request"] = request
    return entry


SHARE = {"shareID": "11111111-2222-3333-4444-555555555555",
         "consumedCapacity": {"memory": "1Gi", "cores": "30", "slots": "1"}}  # fmt: skip


def test_request_classes_names_exact_requests_and_first_available_entries() -> None:
    claim = {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}},
                    {"name": "pick", "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu-big.hami.io"},
                        {"name": "small", "deviceClassName": "gpu-small.hami.io"},
                    ]},
                ]
            }
        }
    }  # fmt: skip
    assert request_classes(claim) == {
        "gpu": "gpu.hami.io",
        "pick/big": "gpu-big.hami.io",
        "pick/small": "gpu-small.hami.io",
    }


def test_request_classes_of_nameless_or_classless_requests_are_empty_strings() -> None:
    claim = {
        "spec": {
            "devices": {"requests": [{"exactly": {"count": 1}}, {"name": "alt", "firstAvailable": [{}]}]}
        }
    }
    assert request_classes(claim) == {"": "", "alt/": ""}


def test_a_share_is_read_with_its_namespace_and_class() -> None:
    claim = allocated([{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}], [result(**SHARE)])
    (use,) = claim_uses(claim, DRIVER)
    assert use == Use(
        DeviceId(DRIVER, "node-1", "gpu-0"), 2**30, 30, 1, namespace="team-a", class_name="gpu.hami.io"
    )
    assert use.consumption == Consumption(False, 2**30, 30, 1)


def test_a_whole_device_is_read_with_its_namespace_and_class_too() -> None:
    claim = allocated([{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}], [result()])
    (use,) = claim_uses(claim, DRIVER)
    assert use == Use(DeviceId(DRIVER, "node-1", "gpu-0"), None, None, None, "team-a", "gpu.hami.io")
    assert use.consumption == WHOLE_DEVICE


def test_a_first_available_result_takes_its_subrequests_class() -> None:
    requests = [
        {"name": "pick", "firstAvailable": [{"name": "small", "deviceClassName": "gpu-small.hami.io"}]}
    ]
    (use,) = claim_uses(allocated(requests, [result("pick/small", **SHARE)]), DRIVER)
    assert use.class_name == "gpu-small.hami.io"


def test_a_result_for_an_unknown_request_has_no_class() -> None:
    requests = [{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}]
    (use,) = claim_uses(allocated(requests, [result("gone", **SHARE)]), DRIVER)
    assert use.class_name == ""


def test_a_result_without_a_request_name_matches_the_nameless_request() -> None:
    requests = [{"exactly": {"deviceClassName": "gpu.hami.io"}}]
    (use,) = claim_uses(allocated(requests, [result(None, **SHARE)]), DRIVER)
    assert use.class_name == "gpu.hami.io"


def test_missing_namespace_pool_and_device_read_as_empty_strings() -> None:
    bare = {"driver": DRIVER, "request": "gpu"}
    (use,) = claim_uses(allocated([], [bare], namespace=None), DRIVER)
    assert use.device == DeviceId(DRIVER, "", "")
    assert use.namespace == ""


def test_other_drivers_and_admin_access_results_take_nothing() -> None:
    results = [result(driver="other.example.com"), result(adminAccess=True)]
    assert claim_uses(allocated([], results), DRIVER) == ()
    assert claim_uses({"metadata": {"name": "unallocated"}}, DRIVER) == ()
