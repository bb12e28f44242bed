"""The chart's CEL, evaluated: the ResourceSlice admission policy, the webhooks' match conditions
and the DeviceClass selectors, with cel-expr-python (cel-cpp) and the optional/string extensions
that Kubernetes' admission environment has. Admission objects are declared ``dyn``, so this checks
syntax and behaviour on sample requests, not Kubernetes' schema typing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helpers import NAMESPACE, Render, find

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is not installed")
ext_optional = pytest.importorskip("cel_expr_python.ext.ext_optional")
ext_strings = pytest.importorskip("cel_expr_python.ext.ext_strings")
descriptor_pool = pytest.importorskip("google.protobuf.descriptor_pool")

PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:t-hami-dra-kubelet-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def env() -> Any:
    return admission_env()


def admission_env() -> Any:
    """A CEL environment with what Kubernetes' admission CEL offers that the chart uses."""
    dyn = cel.Type.DYN
    return cel.NewEnv(
        descriptor_pool.DescriptorPool(),
        variables={"object": dyn, "oldObject": dyn, "request": dyn, "variables": dyn, "params": dyn},
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
    )


def _eval(env: Any, expression: str, inputs: dict[str, Any]) -> Any:
    value = env.compile(expression).eval(env.Activation(inputs))
    assert value.type() != cel.Type.ERROR, f"{expression}: {value.value()}"
    return value.plain_value()


def _admit(
    env: Any, policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any, params: Any = None
) -> str | None:
    """Evaluate a ValidatingAdmissionPolicy like the API server: None if allowed, else the message.
    ``params``: the one parameter object it is evaluated with (a policy with ``paramKind``)."""
    inputs: dict[str, Any] = {
        "request": request, "object": obj, "oldObject": old, "variables": {}, "params": params,
    }  # fmt: skip
    spec = policy["spec"]
    if not all(_eval(env, c["expression"], inputs) for c in spec.get("matchConditions", [])):
        return None
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        variables[variable["name"]] = _eval(env, variable["expression"], {**inputs, "variables": variables})
    inputs["variables"] = variables
    for validation in spec["validations"]:
        if _eval(env, validation["expression"], inputs) is not True:
            if "messageExpression" in validation:
                return str(_eval(env, validation["messageExpression"], inputs))
            return str(validation["message"])
    return None


def _slice(node: str | None, driver: str = "gpu.hami.io", pool: str | None = None) -> dict[str, Any]:
    """A slice of ``node`` whose pool is named after the node unless ``pool`` says otherwise."""
    name = pool if pool is not None else node or "cluster"
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec}


def _request(operation: str, user: str = PLUGIN_USER, node: str | None = "node-a") -> dict[str, Any]:
    extra = {NODE_CLAIM: [node]} if node else {}
    return {"operation": operation, "userInfo": {"username": user, "extra": extra}}


SLICE_CASES = [
    ("own node", _request("CREATE"), _slice("node-a"), None, None),
    ("own node update", _request("UPDATE"), _slice("node-a"), _slice("node-a"), None),
    ("own node delete", _request("DELETE"), None, _slice("node-a"), None),
    (
        "other node",
        _request("CREATE"),
        _slice("node-b"),
        None,
        "may not write ResourceSlices of node 'node-b'",
    ),
    ("other node delete", _request("DELETE"), None, _slice("node-b"), "of node 'node-b'"),
    ("cluster slice", _request("CREATE"), _slice(None), None, "cluster-scoped ResourceSlices"),
    (
        "no node claim",
        _request("CREATE", node=None),
        _slice("node-a"),
        None,
        "ServiceAccountTokenPodNodeInfo",
    ),
    ("other driver", _request("CREATE"), _slice("node-a", "gpu.nvidia.com"), None, "driver 'gpu.nvidia.com'"),
    ("kubelet itself", _request("DELETE", user="system:node:node-b"), None, _slice("node-a"), None),
    (
        "pool of another node",
        _request("CREATE"),
        _slice("node-a", pool="node-b"),
        None,
        "may only publish the pool 'node-a', not 'node-b'",
    ),
    (
        "update to another node's pool",
        _request("UPDATE"),
        _slice("node-a", pool="node-b"),
        _slice("node-a"),
        "not 'node-b'",
    ),
    (
        "pool below the node name",
        _request("CREATE"),
        _slice("node-a", pool="node-a/extra"),
        None,
        "not 'node-a/extra'",
    ),
    (
        "pool with the node as prefix",
        _request("CREATE"),
        _slice("node-a", pool="node-ab"),
        None,
        "not 'node-ab'",
    ),
    (
        "own slice with a foreign pool deleted",
        _request("DELETE"),
        None,
        _slice("node-a", pool="node-b"),
        None,
    ),
    (
        "foreign pool of another node deleted",
        _request("DELETE"),
        None,
        _slice("node-b", pool="node-a"),
        "of node 'node-b'",
    ),
]


@pytest.mark.parametrize(
    ("request_", "obj", "old", "denied"), [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES]
)
def test_resourceslice_policy(
    render: Render, env: Any, request_: dict[str, Any], obj: Any, old: Any, denied: str | None
) -> None:
    policy = find(render(), "ValidatingAdmissionPolicy", "-resourceslices")
    message = _admit(env, policy, request_, obj, old)
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message, message


def _condition(config: dict[str, Any], hook_name: str) -> str:
    hook = next(h for h in config["webhooks"] if h["name"] == hook_name)
    (condition,) = hook["matchConditions"]
    return str(condition["expression"])


OUR_CONFIG = [{"requests": ["gpu"], "opaque": {"driver": "gpu.hami.io", "parameters": {"kind": "GpuConfig"}}}]
OTHER_CONFIG = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]


@pytest.mark.parametrize(
    ("hook", "wrap"),
    [
        ("deviceclasses.gpu.hami.io", lambda config: {"spec": {"config": config} if config else {}}),
        (
            "resourceclaims.gpu.hami.io",
            lambda config: {"spec": {"devices": {"config": config} if config else {}}},
        ),
        (
            "resourceclaimtemplates.gpu.hami.io",
            lambda config: {
                "spec": {"spec": {"devices": {"config": config} if config else {"requests": []}}}
            },
        ),
    ],
)
def test_validating_webhooks_only_see_our_config(render: Render, env: Any, hook: str, wrap: Any) -> None:
    expression = _condition(find(render(), "ValidatingWebhookConfiguration"), hook)
    expected = {"ours": True, "others": False, "none": False}
    for case, config in (("ours", OUR_CONFIG), ("others", OTHER_CONFIG), ("none", None)):
        inputs = {"object": wrap(config), "oldObject": None, "request": {}, "variables": {}}
        assert _eval(env, expression, inputs) is expected[case], case


def test_mutating_webhook_only_sees_pods_with_claims(render: Render, env: Any) -> None:
    expression = _condition(find(render(), "MutatingWebhookConfiguration"), "pods.gpu.hami.io")
    for spec, expected in (
        ({"containers": []}, False),
        ({"resourceClaims": []}, False),
        ({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}, True),
    ):
        inputs = {"object": {"spec": spec}, "oldObject": None, "request": {}, "variables": {}}
        assert _eval(env, expression, inputs) is expected


def test_device_class_selectors_compile_and_select_our_devices(render: Render) -> None:
    """As our controller applies them (without the scheduler fence) they select our devices only;
    as kube-scheduler applies them (every selector) they select none, so its first fit never
    allocates a claim of these classes, whatever the version's device taints."""
    from dra_driver.cel import device_input, selectors_match
    from dra_driver.config.classes import class_selectors
    from dra_driver.contract import SCHEDULER_FENCE

    classes = [o for o in render() if o["kind"] == "DeviceClass"]
    assert len(classes) == 8  # gpu.hami.io, six recipes, mig.gpu.hami.io
    card = {"name": "gpu-0", "attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "15Gi"}}}
    mig = {
        "name": "gpu-1-mig-7-0",
        "attributes": {"type": {"string": "mig"}},
        "capacity": {"memory": {"value": "9Gi"}},
    }
    for device_class in classes:
        # The MIG class selects MIG instances (tests/chart/test_mig_class.py), never a card.
        device = mig if device_class["metadata"]["name"].startswith("mig.") else card
        if device is mig:
            assert not selectors_match(
                "mig class", class_selectors(device_class), device_input("gpu.hami.io", card)
            )
        every = [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]
        assert SCHEDULER_FENCE in every
        ours = class_selectors(device_class)
        assert ours == [e for e in every if e != SCHEDULER_FENCE]
        subject = f"class {device_class['metadata']['name']}"
        assert selectors_match(subject, ours, device_input("gpu.hami.io", device))
        assert not selectors_match(subject, ours, device_input("gpu.nvidia.com", device))
        assert not selectors_match(subject, every, device_input("gpu.hami.io", device))
