"""DeviceClasses with GpuConfig, least-privilege RBAC and the ResourceSlice admission policy."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_driver.config import parse_gpu_config
from dra_driver.contract import ALLOCATED_CONDITION, FINALIZER, GATE_NAME, SCHEDULER_FENCE
from dra_driver.controller.binder import FENCE_ANNOTATION
from tests.chart.combos import CUSTOM_DRIVER
from tests.chart.helpers import ALL_ON, EXAMPLES, NAMESPACE, Render, all_of, find

RECIPES = {
    "binpack": "binpack",
    "spread": "spread",
    "mutex": "mutex",
    "binpack-numa": "binpack,numa",
    "mutex-binpack": "mutex,binpack",
    "mutex-binpack-numa": "mutex,binpack,numa",
}


def _opaque(device_class: dict[str, Any]) -> dict[str, Any]:
    (config,) = device_class["spec"]["config"]
    opaque: dict[str, Any] = config["opaque"]
    return opaque


def test_default_and_recipe_classes(render: Render) -> None:
    classes = {c["metadata"]["name"]: c for c in all_of(render(), "DeviceClass")}
    # mig.gpu.hami.io (MIG instances) is tests/chart/test_mig_class.py's.
    assert set(classes) == {"gpu.hami.io", "mig.gpu.hami.io"} | {
        f"{recipe}.gpu.hami.io" for recipe in RECIPES
    }
    del classes["mig.gpu.hami.io"]
    for name, device_class in classes.items():
        assert device_class["spec"]["selectors"][0] == {
            "cel": {"expression": 'device.driver == "gpu.hami.io"'}
        }
        opaque = _opaque(device_class)
        assert opaque["driver"] == "gpu.hami.io"
        expected = RECIPES.get(name.removesuffix(".gpu.hami.io"), "spread")
        assert opaque["parameters"] == {
            "apiVersion": "gpu.hami.io/v1alpha1",
            "kind": "GpuConfig",
            "policy": expected,
            "nodePolicy": "binpack",
        }


@pytest.mark.parametrize("values_file", [None, ALL_ON], ids=["defaults", "all-options"])
def test_every_gpu_config_passes_the_strict_model(render: Render, values_file: Any) -> None:
    classes = all_of(render(values_file=values_file), "DeviceClass")
    for device_class in classes:
        for config in device_class["spec"].get("config", []):
            parse_gpu_config(config["opaque"]["parameters"])  # raises ConfigError naming the field


def test_all_gpu_config_fields_and_extra_selectors(render: Render) -> None:
    classes = {c["metadata"]["name"]: c for c in all_of(render(values_file=ALL_ON), "DeviceClass")}
    latency = classes["a100-latency.gpu.hami.io"]
    assert _opaque(latency)["parameters"] == {
        "apiVersion": "gpu.hami.io/v1alpha1",
        "kind": "GpuConfig",
        "policy": "mutex, binpack, numa",
        "nodePolicy": "spread",
        "scoringWeights": {"slot": 1, "core": 2, "memory": 3},
        "numaBind": True,
    }
    expressions = [s["cel"]["expression"] for s in latency["spec"]["selectors"]]
    assert expressions == [
        'device.driver == "gpu.hami.io"',
        'device.attributes["gpu.hami.io"].productName.startsWith("NVIDIA A100")',
        SCHEDULER_FENCE,  # kube-scheduler's alone: no device satisfies it
    ]
    assert "config" not in classes["plain.gpu.hami.io"]["spec"], "no config: controller defaults apply"
    assert classes["gpu.hami.io"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert _opaque(classes["mutex.gpu.hami.io"])["parameters"]["nodePolicy"] == "spread"


def test_driver_name_propagates_everywhere(render: Render) -> None:
    objects = render(values=CUSTOM_DRIVER)
    for role in all_of(objects, "ClusterRole"):
        # The GpuQuota API group is fixed too (the chart's crds/): only the quota rules name it.
        fixed = [rule for rule in role["rules"] if rule["apiGroups"] == ["gpu.hami.io"]]
        assert all(resource.startswith("gpuquotas") for rule in fixed for resource in rule["resources"])
        role["rules"] = [rule for rule in role["rules"] if rule not in fixed]
    rendered = yaml.safe_dump_all(objects)
    assert "gpu.hami.io/v1alpha1" in rendered  # the GpuConfig API group is fixed...
    assert GATE_NAME in rendered  # ...so are the names the controller writes, which the policies guard...
    fixed_names = (
        "gpu.hami.io/v1alpha1",
        "gpu.hami.io/scheduling-gate",
        "gpu.hami.io/hami-resources: enabled",
    )
    for name in (*fixed_names, GATE_NAME, FINALIZER, ALLOCATED_CONDITION, FENCE_ANNOTATION):
        rendered = rendered.replace(name, "")
    assert "gpu.hami.io" not in rendered, "...every other mention follows driverName"
    for device_class in all_of(objects, "DeviceClass"):
        assert (
            device_class["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "gpu.example.org"'
        )
        assert _opaque(device_class)["driver"] == "gpu.example.org"


def test_examples_use_the_chart_recipe_classes_and_declare_none(render: Render) -> None:
    """An example re-declaring a chart-owned class would take it from Helm (kubectl delete -f)."""
    chart = {c["metadata"]["name"] for c in all_of(render(), "DeviceClass")}
    for recipe in RECIPES:
        objects = list(yaml.safe_load_all((EXAMPLES / f"{recipe}.yaml").read_text()))
        owned = [o for o in objects if o["kind"] == "DeviceClass"]
        assert not owned, f"{recipe}.yaml declares a class the chart owns"
        template = next(o for o in objects if o["kind"] == "ResourceClaimTemplate")
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == f"{recipe}.gpu.hami.io"
        assert request["exactly"]["deviceClassName"] in chart
        pod = next(o for o in objects if o["kind"] == "Pod")
        assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]


def test_example_claim_config_passes_the_strict_model() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj["kind"] == "ResourceClaimTemplate":
                for config in obj["spec"]["spec"]["devices"].get("config", []):
                    parse_gpu_config(config["opaque"]["parameters"])


def _rules(objects: list[dict[str, Any]], name_suffix: str) -> set[tuple[str, str, str]]:
    role = find(objects, "ClusterRole", name_suffix)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege(render: Render) -> None:
    objects = render()
    for role in all_of(objects, "ClusterRole") + all_of(objects, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role["metadata"]["name"]
    rs = "resource.k8s.io"
    plugin = _rules(objects, "kubelet-plugin")
    assert plugin == {
        *((rs, "resourceslices", v) for v in ("get", "list", "watch", "create", "update", "delete")),
        (rs, "resourceclaims", "get"),
        ("", "nodes", "get"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "update"),  # a repeated event counts on its series
    }
    controller = _rules(objects, "controller")
    assert {
        *((rs, "resourceclaims", v) for v in ("get", "list", "watch", "update")),
        (rs, "resourceclaims/status", "update"),
        (rs, "resourceclaims/binding", "update"),
        *((rs, r, v) for r in ("resourceslices", "deviceclasses") for v in ("get", "list", "watch")),
        *(("", "pods", v) for v in ("get", "list", "watch", "patch")),
        ("", "pods/status", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "update"),
    } <= controller
    # Gangs' minimums: read only (dra_driver/controller/gang_refs.py).
    groups = {
        ("scheduling.x-k8s.io", "podgroups"),
        ("scheduling.k8s.io", "podgroups"),
        ("scheduling.k8s.io", "workloads"),
    }
    assert {(g, r, v) for (g, r, v) in controller if g.startswith("scheduling.")} == {
        (g, r, v) for g, r in groups for v in ("get", "list", "watch")
    }
    # It patches pods only (it keeps them slim, never whole) and updates claims only; what it may
    # change in either is narrowed further by the controller-pods and controller-claims admission
    # policies (test_tenant_policies.py: a patch is an UPDATE to admission).
    assert {r for (_, r, v) in controller if v == "patch"} == {"pods", "pods/status"}
    assert not {r for (_, r, v) in controller if v == "update"} & {"pods", "pods/status"}
    # It creates events, the templates a HAMi-translated pod names (from the stored pod, owned
    # by it: a forged AdmissionReview can make nothing, issue 34) and, to preempt, evictions (a
    # PodDisruptionBudget may refuse them); it deletes nothing.
    assert not {r for (_, r, v) in controller if v in ("create", "delete")} - {
        "events",
        "resourceclaimtemplates",
        "pods/eviction",
    }
    assert ("", "pods", "delete") not in controller
    assert (rs, "resourceclaimtemplates", "create") in controller
    assert (rs, "resourceclaimtemplates", "delete") not in controller
    assert ("", "namespaces", "get") in controller  # ... only in namespaces that opted in
    # Events: events.k8s.io/v1 only, create, and update for series.
    assert {(g, v) for (g, r, v) in controller if r == "events"} == {
        ("events.k8s.io", "create"),
        ("events.k8s.io", "update"),
    }
    assert not {v for (_, r, v) in controller if r == "resourceslices"} - {"get", "list", "watch"}
    webhook = _rules(objects, "webhook")
    assert webhook == {
        (rs, r, "get") for r in ("resourceclaims", "resourceclaimtemplates", "deviceclasses")
    } | {
        # /mutate-hami writes and reads nothing: the webhook holds no create, list or Namespace right.
        ("", "nodes", "list"),  # start-up coexistence warning (device plugins)
        (rs, "deviceclasses", "list"),  # ... and extended-resource DeviceClasses
    }


def test_bindings_point_at_the_right_service_accounts(render: Render) -> None:
    objects = render(values_file=ALL_ON)
    accounts = {sa["metadata"]["name"] for sa in all_of(objects, "ServiceAccount")}
    assert accounts == {"gpu-plugin", "gpu-controller", "gpu-webhook"}
    for binding in all_of(objects, "ClusterRoleBinding"):
        (subject,) = binding["subjects"]
        assert subject["name"] in accounts
        assert subject["namespace"] == NAMESPACE
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]


def test_resourceslice_admission_policy(render: Render) -> None:
    objects = render()
    policy = find(objects, "ValidatingAdmissionPolicy", "-resourceslices")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "-resourceslices")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    plugin_sa = find(objects, "DaemonSet", "kubelet-plugin")["spec"]["template"]["spec"]["serviceAccountName"]
    (condition,) = spec["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{plugin_sa}"' in condition["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "request.userInfo.extra[?'authentication.kubernetes.io/node-name']" in variables["userNodeName"]
    assert "oldObject" in variables["slice"], "DELETE carries the slice in oldObject"
    validations = [v["expression"] for v in spec["validations"]]
    assert "variables.userNodeName == variables.objectNodeName" in validations
    assert "variables.slice.spec.driver == 'gpu.hami.io'" in validations
