"""The chart's tenant admission policies (templates/tenant-policies.yaml), evaluated on sample
requests with cel-expr-python as tests/chart/test_admission_cel.py does. The same attacks run
through the real API server, as a tenant, in tests/cluster/test_tenants.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.contract import ALLOCATED_CONDITION, FINALIZER, GATE_NAME, SCHEDULER_FENCE
from dra_driver.controller.binder import FENCE_ANNOTATION
from dra_driver.controller.decision_record import decision_annotation
from tests.chart.combos import CUSTOM_DRIVER
from tests.chart.helpers import NAMESPACE, Render, find
from tests.chart.test_admission_cel import _admit, admission_env

CONTROLLER = f"system:serviceaccount:{NAMESPACE}:t-hami-dra-controller"
TENANT = "system:serviceaccount:team-a:tenant"
GATE = GATE_NAME
TAINT = "gpu.hami.io/policy-managed"


@pytest.fixture(scope="module")
def env() -> Any:
    return admission_env()


def policy(render: Render, name: str) -> dict[str, Any]:
    return find(render(), "ValidatingAdmissionPolicy", f"-{name}")


def request(user: str, resource: str = "pods", sub: str = "", operation: str = "UPDATE") -> dict[str, Any]:
    body: dict[str, Any] = {
        "operation": operation,
        "userInfo": {"username": user, "extra": {}},
        "resource": {"group": "", "version": "v1", "resource": resource},
    }
    if sub:  # the real API server leaves the key out for the main resource
        body["subResource"] = sub
    return body


# --- pods ------------------------------------------------------------------------------------------


def gated_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "x"}, "annotations": {"a": "1"}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "schedulingGates": [{"name": GATE}, {"name": "other.example.com/gate"}],
            "tolerations": [],
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]},
    }


def edit(obj: dict[str, Any], change: Any) -> dict[str, Any]:
    copied = copy.deepcopy(obj)
    change(copied)
    return copied


def without_our_gate(pod: dict[str, Any]) -> None:
    pod["spec"]["schedulingGates"] = [g for g in pod["spec"]["schedulingGates"] if g["name"] != GATE]


GATE_CASES = [
    ("tenant lifts our gate", TENANT, without_our_gate, "only the gpu.hami.io controller may remove"),
    (
        "tenant lifts every gate",
        TENANT,
        lambda p: p["spec"].pop("schedulingGates"),
        "may remove the scheduling",
    ),
    ("controller lifts our gate", CONTROLLER, without_our_gate, None),
    (
        "tenant lifts another gate",
        TENANT,
        lambda p: p["spec"].update(schedulingGates=[{"name": GATE}]),
        None,
    ),
    ("tenant edits an image", TENANT, lambda p: p["spec"]["containers"][0].update(image="evil"), None),
]


@pytest.mark.parametrize(
    ("user", "change", "denied"), [c[1:] for c in GATE_CASES], ids=[c[0] for c in GATE_CASES]
)
def test_only_the_controller_lifts_our_gate(
    render: Render,
    env: Any,
    user: str,
    change: Any,
    denied: str | None,
) -> None:
    old = gated_pod()
    message = _admit(env, policy(render, "pod-gate"), request(user), edit(old, change), old)
    assert message == denied or (denied is not None and message is not None and denied in message), message


def lift_with_annotation(pod: dict[str, Any]) -> None:
    without_our_gate(pod)
    pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = "GPU-1,NVIDIA,1000,0:;"
    pod["metadata"]["annotations"]["gpu.hami.io/decision"] = '{"version":1}'


CONTROLLER_POD_CASES = [
    ("gate, HAMi annotation and decision record", "", lift_with_annotation, None),
    (
        "the templates it made for a HAMi-translated pod",
        "",
        lambda p: p["metadata"]["annotations"].update(
            {"gpu.hami.io/hami-templates": "hami-1gpu-whole-100cores-0a"}
        ),
        None,
    ),
    (
        "a preemptor's nomination",
        "",
        lambda p: p["metadata"]["annotations"].update({"gpu.hami.io/nomination": '{"node":"n"}'}),
        None,
    ),
    (
        "a preempted pod's DisruptionTarget condition",
        "status",
        lambda p: p["status"]["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByHamiDra"}
        ),
        None,
    ),
    ("an image", "", lambda p: p["spec"]["containers"][0].update(image="evil"), "containers, images"),
    ("a toleration", "", lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}]), "tolerations"),
    ("a label", "", lambda p: p["metadata"]["labels"].update(app="y"), "only the annotations"),
    ("another annotation", "", lambda p: p["metadata"]["annotations"].update(b="2"), "only the annotations"),
    ("an annotation removed", "", lambda p: p["metadata"].pop("annotations"), "only the annotations"),
    ("a finalizer", "", lambda p: p["metadata"].update(finalizers=["x"]), "only the annotations"),
    (
        "another gate",
        "",
        lambda p: p["spec"].update(schedulingGates=[{"name": GATE}]),
        "only its own scheduling gate",
    ),
    (
        "our condition",
        "status",
        lambda p: p["status"]["conditions"].append({"type": "gpu.hami.io/Allocated", "status": "False"}),
        None,
    ),
    (
        "another condition",
        "status",
        lambda p: p["status"]["conditions"][0].update(status="True"),
        "only its own pod condition",
    ),
    ("the phase", "status", lambda p: p["status"].update(phase="Failed"), "only its own pod condition"),
]


@pytest.mark.parametrize(
    ("sub", "change", "denied"),
    [c[1:] for c in CONTROLLER_POD_CASES],
    ids=[c[0] for c in CONTROLLER_POD_CASES],
)
def test_the_controller_changes_nothing_else_in_a_pod(
    render: Render,
    env: Any,
    sub: str,
    change: Any,
    denied: str | None,
) -> None:
    old = gated_pod()
    message = _admit(
        env, policy(render, "controller-pods"), request(CONTROLLER, sub=sub), edit(old, change), old
    )
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message, message


def test_the_controller_policy_leaves_everyone_else_alone(render: Render, env: Any) -> None:
    old = gated_pod()
    new = edit(old, lambda p: p["spec"]["containers"][0].update(image="new"))
    assert _admit(env, policy(render, "controller-pods"), request(TENANT), new, old) is None


# --- claims ----------------------------------------------------------------------------------------


def allocated_claim(driver: str = "gpu.hami.io", allocated: bool = True) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": "team-a", "finalizers": [GATE, "resource.kubernetes.io/x"]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.hami.io"}}]}},
        "status": {},
    }
    if allocated:
        claim["status"]["allocation"] = {
            "devices": {"results": [{"request": "gpu", "driver": driver, "pool": "n", "device": "gpu-0"}]}
        }
    return claim


def drop_our_finalizer(claim: dict[str, Any]) -> None:
    claim["metadata"]["finalizers"] = [f for f in claim["metadata"]["finalizers"] if f != GATE]


@pytest.mark.parametrize(
    ("user", "allocated", "denied"),
    [(TENANT, True, True), (TENANT, False, False), (CONTROLLER, True, False)],
    ids=["tenant, allocated", "tenant, not allocated", "controller"],
)
def test_only_the_controller_releases_an_allocated_claim(
    render: Render,
    env: Any,
    user: str,
    allocated: bool,
    denied: bool,
) -> None:
    old = allocated_claim(allocated=allocated)
    message = _admit(
        env,
        policy(render, "claim-finalizer"),
        request(user, "resourceclaims"),
        edit(old, drop_our_finalizer),
        old,
    )
    assert (message is not None) is denied, message
    if denied:
        assert message is not None and "only the gpu.hami.io controller removes it" in message


def claim_with(request_body: dict[str, Any], template: bool = False) -> dict[str, Any]:
    spec = {"devices": {"requests": [request_body]}}
    return {"metadata": {"name": "c"}, "spec": {"spec": spec} if template else spec}


def exactly(klass: str = "gpu.hami.io", **fields: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": klass, **fields}}


def first_available(klass: str = "gpu.hami.io", **fields: Any) -> dict[str, Any]:
    return {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": klass, **fields}]}


ALL_TAINTS = [{"operator": "Exists"}]
POLICY_TAINT = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]

REQUEST_CASES = [
    ("plain request", exactly(), None),
    ("memory request", exactly(capacity={"requests": {"memory": "1Gi"}}), None),
    ("tolerates the policy taint", exactly(tolerations=POLICY_TAINT), "may not tolerate"),
    ("tolerates every taint", exactly(tolerations=ALL_TAINTS), "may not tolerate"),
    (
        "recipe class, policy taint",
        exactly("binpack.gpu.hami.io", tolerations=POLICY_TAINT),
        "may not tolerate",
    ),
    ("subrequest tolerates", first_available(tolerations=ALL_TAINTS), "may not tolerate"),
    ("tolerates another taint", exactly(tolerations=[{"key": "x", "operator": "Exists"}]), None),
    ("another driver's class", exactly("gpu.nvidia.com", tolerations=ALL_TAINTS), None),
    ("ten slots", exactly(capacity={"requests": {"slots": "10"}}), "may not ask for slots"),
    ("one slot", exactly(capacity={"requests": {"slots": "1"}}), None),
    ("subrequest slots", first_available(capacity={"requests": {"slots": "2"}}), "may not ask for slots"),
    ("another driver's slots", exactly("x.example.com", capacity={"requests": {"slots": "2"}}), None),
]


@pytest.mark.parametrize("template", [False, True], ids=["claim", "template"])
@pytest.mark.parametrize(
    ("body", "denied"), [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES]
)
def test_claims_of_our_classes_cannot_bypass_the_controller(
    render: Render,
    env: Any,
    template: bool,
    body: dict[str, Any],
    denied: str | None,
) -> None:
    resource = "resourceclaimtemplates" if template else "resourceclaims"
    obj = claim_with(body, template)
    message = _admit(
        env, policy(render, "claim-requests"), request(TENANT, resource, operation="CREATE"), obj, None
    )
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message, message


def test_extra_device_classes_are_guarded_too(render: Render, env: Any) -> None:
    spec = find(
        render(values={"admissionPolicy": {"extraDeviceClasses": ["a100.example.com"]}}),
        "ValidatingAdmissionPolicy",
        "-claim-requests",
    )
    obj = claim_with(exactly("a100.example.com", tolerations=ALL_TAINTS))
    assert _admit(env, spec, request(TENANT, "resourceclaims", operation="CREATE"), obj, None) is not None


CONTROLLER_CLAIM_CASES = [
    (
        "adds its finalizer",
        "",
        edit(allocated_claim(allocated=False), drop_our_finalizer),
        lambda c: c["metadata"]["finalizers"].append(GATE),
        None,
    ),
    ("drops its finalizer", "", allocated_claim(), drop_our_finalizer, None),
    (
        "fences",
        "",
        allocated_claim(allocated=False),
        lambda c: c["metadata"].update(annotations={"gpu.hami.io/fenced-by": "x"}),
        None,
    ),
    ("a label", "", allocated_claim(), lambda c: c["metadata"].update(labels={"a": "b"}), "may change only"),
    (
        "another finalizer",
        "",
        allocated_claim(),
        lambda c: c["metadata"].update(finalizers=[GATE]),
        "may change only",
    ),
    ("deallocates ours", "status", allocated_claim(), lambda c: c["status"].pop("allocation"), None),
    (
        "deallocates another driver's",
        "status",
        allocated_claim("gpu.nvidia.com"),
        lambda c: c["status"].pop("allocation"),
        "only of claims it allocates",
    ),
    (
        "allocates another driver's",
        "status",
        allocated_claim(allocated=False),
        lambda c: c["status"].update(allocated_claim("gpu.nvidia.com")["status"]),
        "only of claims it allocates",
    ),
    (
        "touches an unallocated status",
        "status",
        allocated_claim(allocated=False),
        lambda c: c["status"].update(reservedFor=[{"resource": "pods", "name": "p", "uid": "u"}]),
        "only of claims it allocates",
    ),
]


@pytest.mark.parametrize(
    ("sub", "old", "change", "denied"),
    [c[1:] for c in CONTROLLER_CLAIM_CASES],
    ids=[c[0] for c in CONTROLLER_CLAIM_CASES],
)
def test_the_controller_writes_only_claims_of_its_driver(
    render: Render,
    env: Any,
    sub: str,
    old: dict[str, Any],
    change: Any,
    denied: str | None,
) -> None:
    new = edit(old, change)
    message = _admit(
        env, policy(render, "controller-claims"), request(CONTROLLER, "resourceclaims", sub), new, old
    )
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message, message


# --- version conversion ----------------------------------------------------------------------------


def test_every_tenant_policy_sees_requests_converted_to_v1(render: Render) -> None:
    """The expressions read v1's shape (``exactly``); a v1beta1 request matched with "*" would reach
    them in its own shape (no ``exactly``) and pass every rule."""
    policies = [o for o in render() if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 9  # the kubelet plugin's resourceslices policy too
    for body in policies:
        constraints = body["spec"]["matchConstraints"]
        assert constraints.get("matchPolicy", "Equivalent") == "Equivalent", body["metadata"]["name"]
        for rule in constraints["resourceRules"]:
            assert rule["apiVersions"] == ["v1"], body["metadata"]["name"]


# --- riders: pods bound to a node, claims reserved for a further pod -------------------------------


def bound_pod(*claims: str, node: str = "node-a", template: str | None = None) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    if template is not None:
        entries.append({"name": "t", "resourceClaimTemplateName": template})
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}], "resourceClaims": entries}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "rider", "namespace": "team-a"}, "spec": spec}


def named_claim(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a"}, "spec": {"devices": {"requests": [body]}}}


BOUND_CASES = [
    ("names a claim of ours", bound_pod("held"), named_claim("held", exactly()), "uses ResourceClaim held"),
    (
        "names a subrequest claim of ours",
        bound_pod("other", "held"),
        named_claim("held", first_available("spread.gpu.hami.io")),
        "uses ResourceClaim held",
    ),
    ("another claim of the namespace", bound_pod("x"), named_claim("held", exactly()), None),
    ("another driver's claim", bound_pod("held"), named_claim("held", exactly("gpu.nvidia.com")), None),
    ("not bound to a node", bound_pod("held", node=""), named_claim("held", exactly()), None),
    ("a template only", bound_pod(template="t"), named_claim("t", exactly()), None),
]


@pytest.mark.parametrize(
    ("pod", "param", "denied"), [c[1:] for c in BOUND_CASES], ids=[c[0] for c in BOUND_CASES]
)
def test_a_pod_bound_to_a_node_may_not_name_a_claim_of_ours(
    render: Render, env: Any, pod: dict[str, Any], param: dict[str, Any], denied: str | None
) -> None:
    message = _admit(
        env, policy(render, "bound-pods"), request(TENANT, operation="CREATE"), pod, None, params=param
    )
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message and "leave spec.nodeName out" in message, message


def test_the_bound_pod_policy_reads_every_claim_of_the_pods_namespace(render: Render) -> None:
    objects = render()
    assert policy(render, "bound-pods")["spec"]["paramKind"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
    }
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "-bound-pods")
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}
    assert binding["spec"]["validationActions"] == ["Deny"]


def reserved(*pods: str) -> list[dict[str, str]]:
    return [{"resource": "pods", "name": name, "uid": f"uid-{name}"} for name in pods]


def claim_reserved_for(body: dict[str, Any], *pods: str) -> dict[str, Any]:
    obj = named_claim("held", body)
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.hami.io", "pool": "n", "device": "gpu-0"}]
            }
        },
        "reservedFor": reserved(*pods),
    }
    return obj


SHARE = exactly(capacity={"requests": {"memory": "6Gi"}})
CORES = first_available("mutex.gpu.hami.io", capacity={"requests": {"cores": "30"}})
RESERVATION_CASES = [
    ("a share, a second pod", SHARE, ("holder",), ("holder", "rider"), "reserved for one pod at a time"),
    ("a cores subrequest, a second pod", CORES, ("holder",), ("holder", "rider"), "reserved for one pod"),
    ("a share, its first pod", SHARE, (), ("holder",), None),
    ("a share, the holder leaves", SHARE, ("holder", "rider"), ("rider",), None),
    ("a share, the next pod after the holder", SHARE, ("holder",), ("next",), None),
    ("a whole card, a second pod", exactly(), ("holder",), ("holder", "rider"), None),
    (
        "another driver's share",
        exactly("gpu.nvidia.com", capacity={"requests": {"memory": "6Gi"}}),
        ("holder",),
        ("holder", "rider"),
        None,
    ),
]


@pytest.mark.parametrize(
    ("body", "before", "after", "denied"),
    [c[1:] for c in RESERVATION_CASES],
    ids=[c[0] for c in RESERVATION_CASES],
)
@pytest.mark.parametrize("user", ["system:kube-controller-manager", "system:kube-scheduler", CONTROLLER])
def test_a_limited_claim_is_reserved_for_one_pod_whoever_writes(
    render: Render,
    env: Any,
    user: str,
    body: dict[str, Any],
    before: tuple[str, ...],
    after: tuple[str, ...],
    denied: str | None,
) -> None:
    old = claim_reserved_for(body, *before)
    new = claim_reserved_for(body, *after)
    message = _admit(
        env, policy(render, "claim-reservations"), request(user, "resourceclaims", "status"), new, old
    )
    if denied is None:
        assert message is None
    else:
        assert message is not None and denied in message and user in message, message


def asking(resource: str, where: str = "limits", init: bool = False) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", "resources": {where: {resource: "1"}}}
    spec: dict[str, Any] = {"containers": [{"name": "plain", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].append(container)
    return {"metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


EXTENDED_CASES = [
    ("our class by its implicit name", asking("deviceclass.resource.kubernetes.io/gpu.hami.io"), True),
    (
        "a recipe class, as a request, in an init container",
        asking("deviceclass.resource.kubernetes.io/mutex.gpu.hami.io", "requests", init=True),
        True,
    ),
    ("another driver's class", asking("deviceclass.resource.kubernetes.io/gpu.nvidia.com"), False),
    ("a device plugin's resource", asking("nvidia.com/gpu"), False),
    ("cpu", asking("cpu", "requests"), False),
]


@pytest.mark.parametrize(
    ("pod", "denied"), [c[1:] for c in EXTENDED_CASES], ids=[c[0] for c in EXTENDED_CASES]
)
def test_pods_may_not_ask_for_our_classes_as_extended_resources(
    render: Render, env: Any, pod: dict[str, Any], denied: bool
) -> None:
    message = _admit(
        env, policy(render, "extended-resources"), request(TENANT, operation="CREATE"), pod, None
    )
    assert (message is not None) is denied, message
    if denied:
        assert message is not None and "use a ResourceClaim or a ResourceClaimTemplate" in message


def test_a_class_configured_extended_resource_name_is_left_to_the_fence(render: Render, env: Any) -> None:
    """A device plugin may serve the same name (nvidia.com/gpu) on other nodes: not refused; the
    scheduler fence keeps kube-scheduler's DRA first fit off our classes instead."""
    classes = [{"name": "gpu.hami.io", "extendedResourceName": "nvidia.com/gpu"}]
    objects = render(values={"deviceClasses": classes})
    rendered = find(objects, "ValidatingAdmissionPolicy", "-extended-resources")
    request_body = request(TENANT, operation="CREATE")
    assert _admit(env, rendered, request_body, asking("nvidia.com/gpu"), None) is None
    implicit = asking("deviceclass.resource.kubernetes.io/gpu.hami.io")
    assert _admit(env, rendered, request_body, implicit, None) is not None
    (mapped,) = [o for o in objects if o["kind"] == "DeviceClass" and o["metadata"]["name"] == "gpu.hami.io"]
    assert SCHEDULER_FENCE in [s["cel"]["expression"] for s in mapped["spec"]["selectors"]]


# --- the names the controller writes, whatever the driver's name -------------------------------------


@pytest.mark.parametrize("values", [{}, CUSTOM_DRIVER], ids=["default", "custom-driver"])
def test_the_policies_guard_the_names_the_controller_really_writes(
    render: Render, env: Any, values: dict[str, Any]
) -> None:
    """The gate, finalizer, condition and fence annotation are fixed names in the code, whatever
    ``driverName`` is: with a custom driver name, policies guarding ``<driverName>/allocation``
    left the real gate to tenants and refused the controller's own gate lift."""
    driver = values.get("driverName", "gpu.hami.io")
    objects = render(values)

    def named(name: str) -> dict[str, Any]:
        return find(objects, "ValidatingAdmissionPolicy", f"-{name}")

    pod = gated_pod()
    lifted = edit(pod, without_our_gate)
    assert _admit(env, named("pod-gate"), request(TENANT), lifted, pod) is not None
    placed = edit(lifted, lambda p: p["metadata"]["annotations"].update({decision_annotation(driver): "{}"}))
    assert _admit(env, named("controller-pods"), request(CONTROLLER), placed, pod) is None
    condition = {"type": ALLOCATED_CONDITION, "status": "True"}
    reported = edit(pod, lambda p: p["status"]["conditions"].append(condition))
    assert _admit(env, named("controller-pods"), request(CONTROLLER, sub="status"), reported, pod) is None

    claim = allocated_claim(driver)
    assert FINALIZER in claim["metadata"]["finalizers"]
    released = edit(claim, drop_our_finalizer)
    assert (
        _admit(env, named("claim-finalizer"), request(TENANT, "resourceclaims"), released, claim) is not None
    )
    fenced = edit(released, lambda c: c["metadata"].update(annotations={FENCE_ANNOTATION: "me"}))
    assert (
        _admit(env, named("controller-claims"), request(CONTROLLER, "resourceclaims"), fenced, claim) is None
    )
