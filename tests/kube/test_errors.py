"""``KubeError`` (dra_driver/kube/errors.py): the status picks the class a caller catches, and a
subclass built without a status stands for its own."""

from __future__ import annotations

import pickle

import pytest

from dra_driver.kube.errors import Conflict, Forbidden, Gone, Invalid, KubeError, NotFound, Unavailable


@pytest.mark.parametrize(
    ("status", "cls"),
    [(404, NotFound), (409, Conflict), (410, Gone), (403, Forbidden), (422, Invalid), (429, Unavailable),
     (0, Unavailable), (500, Unavailable), (503, Unavailable), (400, KubeError)],
)  # fmt: skip
def test_the_status_picks_the_class(status: int, cls: type[KubeError]) -> None:
    err = KubeError(status, "boom")
    assert type(err) is cls
    assert err.status == status and err.message == "boom"


def test_a_plain_client_error_keeps_its_status_and_message() -> None:
    err = KubeError(400, "bad request")
    assert type(err) is KubeError
    assert (err.status, err.message, str(err)) == (400, "bad request", "400: bad request")


def test_the_message_is_prefixed_with_the_status_only_when_there_is_one() -> None:
    assert str(KubeError(404, "pods x not found")) == "404: pods x not found"
    assert str(KubeError(0, "connection refused")) == "connection refused"


def test_built_without_arguments_an_error_is_an_unreachable_server_with_no_message() -> None:
    err = KubeError()
    assert type(err) is Unavailable
    assert (err.status, err.message, str(err)) == (0, "", "")


@pytest.mark.parametrize("cls", [NotFound, Conflict, Gone, Forbidden, Invalid])
def test_a_subclass_built_without_a_status_stands_for_its_own(cls: type[KubeError]) -> None:
    err = cls(message="why")
    assert err.status == cls.code
    assert str(err) == f"{cls.code}: why"
    assert cls().message == ""


def test_unavailable_without_a_status_stays_at_zero() -> None:
    err = Unavailable(message="timed out")
    assert (err.status, str(err)) == (0, "timed out")


def test_a_subclass_given_another_status_keeps_it() -> None:
    # e.g. a fake raising Invalid for a 400: the status said is the status kept
    err = Invalid(400, "bad field")
    assert type(err) is Invalid and err.status == 400 and str(err) == "400: bad field"


def test_the_meanings_are_also_booleans() -> None:
    assert KubeError(409).conflict and not KubeError(409).not_found and not KubeError(409).gone
    assert KubeError(404).not_found and not KubeError(404).conflict
    assert KubeError(410).gone and not KubeError(410).not_found


def test_an_error_survives_pickling_with_its_class_status_and_message() -> None:
    err = pickle.loads(pickle.dumps(KubeError(409, "changed")))
    assert type(err) is Conflict and (err.status, err.message) == (409, "changed")
