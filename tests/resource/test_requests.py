"""A claim's device requests, parsed (dra_driver/resource/requests.py): ours and other drivers',
capacity rounded to the slices' request policy, and what we cannot honour refused with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.resource.requests import RequestError, RequestSpec, claim_requests, request_spec

DRIVER = "gpu.hami.io"


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {"requests": list(requests)}}}


def exact(name: str, **body: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": DRIVER, **body}}


def asking(**capacity: str) -> dict[str, Any]:
    return claim(exact("a", capacity={"requests": capacity}))


def test_our_requests_are_parsed_and_other_drivers_named() -> None:
    ours = exact("a", capacity={"requests": {"memory": "1000.5Mi", "cores": "30"}})
    theirs = {"name": "x", "exactly": {"deviceClassName": "other"}}
    parsed, foreign = claim_requests(claim(ours, theirs), lambda name: name == DRIVER)
    assert foreign == ["x"]
    spec = parsed[0].alternatives[0]
    assert spec.memory == 1001 * 2**20 and spec.cores == 30  # memory rounded up to whole MiB


@pytest.mark.parametrize(
    ("capacity", "reason"),
    [
        ({"cores": "150"}, "cores 150 exceeds 100"),
        ({"memory": "lots"}, "memory 'lots'"),
        ({"memory": "-1Gi"}, "memory -1Gi is negative"),
        ({"cores": "-5"}, "cores -5 is negative"),
        # kube-scheduler finds no device for a capacity our devices do not publish, and consumes
        # the slots asked for: allocating with them ignored (consumedCapacity slots "1") is wrong.
        ({"memory": "1Gi", "bogus": "1"}, "capacity bogus is not published by our devices"),
        ({"memory": "1Gi", "slots": "3"}, "slots 3 is not supported"),
    ],
    ids=["cores-over-100", "unparsable-memory", "negative-memory", "negative-cores", "unknown-capacity",
         "several-slots"],
)  # fmt: skip
def test_capacity_we_cannot_honour_is_refused_not_clamped_or_ignored(
    capacity: dict[str, str], reason: str
) -> None:
    with pytest.raises(RequestError, match=reason):
        claim_requests(asking(**capacity), lambda name: True)


def spec_of(**capacity: str) -> Any:
    parsed, _ = claim_requests(asking(**capacity), lambda name: True)
    return parsed[0].alternatives[0]


@pytest.mark.parametrize(
    ("capacity", "memory", "cores"),
    [({"memory": "0"}, 2**20, 0), ({"cores": "0"}, None, 0), ({"cores": "0.5"}, None, 1),
     ({"cores": "100"}, None, 100), ({"memory": "1Mi", "slots": "1"}, 2**20, 0)],
    ids=["zero-memory-takes-the-policy-minimum", "zero-cores", "half-a-core-rounds-up", "all-cores",
         "one-slot"],
)  # fmt: skip
def test_the_edges_of_what_we_honour_are_accepted(
    capacity: dict[str, str], memory: int | None, cores: int
) -> None:
    spec = spec_of(**capacity)
    assert (spec.memory, spec.cores) == (memory, cores)


@pytest.mark.parametrize(
    ("capacity", "reason"),
    [({"cores": "101"}, r"^a: cores 101 exceeds 100"), ({"slots": "2"}, r"^a: slots 2 is not supported"),
     ({"zeta": "1", "alpha": "1"}, r"^a: capacity alpha, zeta is not published"),
     ({"cores": "-1"}, r"^a: cores -1 is negative")],
    ids=["cores-101", "two-slots", "unknown-names-sorted-and-listed", "named-by-request"],
)  # fmt: skip
def test_the_refusal_names_the_request_and_what_is_just_over_the_edge(
    capacity: dict[str, str], reason: str
) -> None:
    with pytest.raises(RequestError, match=reason):
        claim_requests(asking(**capacity), lambda name: True)


def test_a_request_body_is_read_field_by_field() -> None:
    toleration = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    body = {
        "deviceClassName": "gpu.hami.io",
        "allocationMode": "All",
        "selectors": [
            {"cel": {"expression": "device.attributes['gpu.hami.io'].model == 'A100'"}},
            {"cel": {}},
            {},
        ],
        "tolerations": [toleration],
    }
    spec = request_spec("gpu", body, True)
    assert spec == RequestSpec(
        name="gpu",
        class_name="gpu.hami.io",
        selectors=("device.attributes['gpu.hami.io'].model == 'A100'",),
        all_devices=True,
        count=1,
        memory=None,
        cores=0,
        admin_access=True,
        tolerations=(toleration,),
    )


def test_an_empty_request_body_takes_the_defaults() -> None:
    spec = request_spec("gpu", {}, False)
    assert spec.class_name == ""
    assert spec.selectors == () and spec.tolerations == ()
    assert spec.all_devices is False and spec.admin_access is False
    assert (spec.count, spec.memory, spec.cores) == (1, None, 0)


def test_exact_count_is_not_all_devices() -> None:
    assert request_spec("gpu", {"allocationMode": "ExactCount", "count": 2}, False).all_devices is False


def test_admin_access_and_the_request_name_reach_the_parsed_request() -> None:
    admin = exact("debug", adminAccess=True)
    plain = exact("gpu")
    parsed, foreign = claim_requests(claim(admin, plain), lambda name: name == DRIVER)
    assert foreign == []
    assert [request.name for request in parsed] == ["debug", "gpu"]
    assert [request.alternatives[0].admin_access for request in parsed] == [True, False]


def test_a_request_without_a_name_is_named_empty() -> None:
    parsed, _ = claim_requests(claim({"exactly": {"deviceClassName": DRIVER}}), lambda name: True)
    assert parsed[0].name == "" and parsed[0].alternatives[0].name == ""
