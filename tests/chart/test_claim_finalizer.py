"""The claim finalizer at admission (charts/hami-dra/templates/claim-finalizer.yaml and the
webhook's ``claims`` entry): a MutatingAdmissionPolicy where the API server serves one, the webhook
otherwise, nothing when turned off; the policy is dra_driver/webhook/policy.py's, and its match
conditions decide "a class of ours" as the controller does (evaluated with cel-expr-python)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.config.classes import is_driver_class
from dra_driver.webhook.policy import claim_finalizer_policy
from tests.chart.combos import CUSTOM_DRIVER
from tests.chart.helpers import Render, all_of, find

MAP = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def finalizer_webhooks(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    mutating = find(objects, "MutatingWebhookConfiguration")
    return [hook for hook in mutating["webhooks"] if hook["name"].startswith("claims.")]


def policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return all_of(objects, "MutatingAdmissionPolicy") + all_of(objects, "MutatingAdmissionPolicyBinding")


@pytest.mark.parametrize("values", [{}, CUSTOM_DRIVER], ids=["default", "custom-driver"])
def test_where_the_policy_api_is_served_the_policy_is_the_controllers_own(
    render: Render, values: dict[str, Any]
) -> None:
    driver = values.get("driverName", "gpu.hami.io")
    objects = render(values, kube_version="1.36.0", api_versions=(MAP,))
    assert finalizer_webhooks(objects) == []
    rendered = policies(objects)
    name = rendered[0]["metadata"]["name"]
    expected = claim_finalizer_policy(driver, name)
    assert [(o["kind"], o["spec"]) for o in rendered] == [(o["kind"], o["spec"]) for o in expected]
    assert rendered[0]["spec"]["failurePolicy"] == "Ignore"


def test_elsewhere_the_webhook_adds_it_and_never_blocks_a_claim(render: Render) -> None:
    objects = render()
    assert policies(objects) == []
    (hook,) = finalizer_webhooks(objects)
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["service"]["path"] == "/mutate-claims"
    (rule,) = hook["rules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["resource.k8s.io"],
        ["resourceclaims"],
        ["CREATE"],
    )


@pytest.mark.parametrize(
    ("values", "served", "policy", "webhook"),
    [
        ({"controller": {"claimFinalizer": "off"}}, True, False, False),
        ({"controller": {"claimFinalizer": "off"}}, False, False, False),
        ({"controller": {"claimFinalizer": "policy"}}, False, True, False),
        ({"controller": {"claimFinalizer": "webhook"}}, True, False, True),
        ({"controller": {"enabled": False}}, True, False, False),
        ({"webhook": {"enabled": False}}, False, False, False),
        ({"webhook": {"enabled": False}}, True, True, False),
    ],
    ids=[
        "off-served",
        "off",
        "policy-forced",
        "webhook-forced",
        "no-controller",
        "no-webhook",
        "no-webhook-served",
    ],
)
def test_the_mode_picks_one_or_none(
    render: Render, values: dict[str, Any], served: bool, policy: bool, webhook: bool
) -> None:
    objects = render(values, api_versions=(MAP,) if served else ())
    assert bool(policies(objects)) is policy
    has_webhook = bool(all_of(objects, "MutatingWebhookConfiguration")) and bool(finalizer_webhooks(objects))
    assert has_webhook is webhook


# --- the match conditions, evaluated ------------------------------------------------------------------

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is not installed")


def _applies(driver: str, claim: dict[str, Any], device_class: dict[str, Any]) -> bool:
    """Whether every match condition of the policy holds for ``claim`` with ``device_class`` as its
    parameter (the API server evaluates it once per DeviceClass)."""
    from tests.chart.test_admission_cel import admission_env

    env = admission_env()
    spec = claim_finalizer_policy(driver, "x")[0]["spec"]
    programs = {c["name"]: env.compile(c["expression"]) for c in spec["matchConditions"]}
    inputs = {"object": claim, "params": device_class, "oldObject": None, "request": {}, "variables": {}}
    results = []
    for program in programs.values():
        value = program.eval(env.Activation(inputs))
        assert value.type() != cel.Type.ERROR, value.value()
        results.append(value.plain_value())
    return all(results)


def device_class(name: str, selector: str | None = None, config_driver: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selector is not None:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    if config_driver is not None:
        spec["config"] = [{"opaque": {"driver": config_driver, "parameters": {}}}]
    return {"metadata": {"name": name}, "spec": spec}


CLASSES = [
    device_class("gpu.hami.io"),
    device_class("binpack.gpu.hami.io", 'device.driver == "gpu.hami.io"'),
    device_class("single", "device.driver=='gpu.hami.io' && device.attributes['x'].y"),
    device_class("spaced", 'device . driver ==  "gpu.hami.io"'),
    device_class("configured", config_driver="gpu.hami.io"),
    device_class("other", 'device.driver == "gpu.nvidia.com"'),
    device_class("lookalike", 'device.driver == "gpuXhamiXio"'),
    device_class("other-config", config_driver="gpu.nvidia.com"),
    device_class("bare"),
]


@pytest.mark.parametrize("klass", CLASSES, ids=[c["metadata"]["name"] for c in CLASSES])
def test_a_class_counts_as_ours_exactly_when_the_controller_says_so(klass: dict[str, Any]) -> None:
    name = klass["metadata"]["name"]
    requests = [{"name": "g", "exactly": {"deviceClassName": name}}]
    claim = {"metadata": {}, "spec": {"devices": {"requests": requests}}}
    assert _applies("gpu.hami.io", claim, klass) is is_driver_class(klass, "gpu.hami.io")


def test_the_claim_must_name_the_class_and_not_carry_the_finalizer_yet() -> None:
    ours = CLASSES[0]

    def claim(requests: list[dict[str, Any]], finalizers: list[str] | None = None) -> dict[str, Any]:
        metadata = {} if finalizers is None else {"finalizers": finalizers}
        return {"metadata": metadata, "spec": {"devices": {"requests": requests}}}

    exactly = [{"name": "g", "exactly": {"deviceClassName": "gpu.hami.io"}}]
    choices = [{"name": "a", "deviceClassName": "other"}, {"name": "b", "deviceClassName": "gpu.hami.io"}]
    alternative = [{"name": "g", "firstAvailable": choices}]
    elsewhere = [{"name": "g", "exactly": {"deviceClassName": "other"}}]
    assert _applies("gpu.hami.io", claim(exactly), ours)
    assert _applies("gpu.hami.io", claim(alternative), ours)
    assert _applies("gpu.hami.io", claim(exactly, ["someone.else/keep"]), ours)
    assert not _applies("gpu.hami.io", claim(elsewhere), ours)
    assert not _applies("gpu.hami.io", claim([]), ours)
    assert not _applies("gpu.hami.io", claim(exactly, ["gpu.hami.io/allocation"]), ours)
