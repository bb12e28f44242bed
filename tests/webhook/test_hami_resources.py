"""HAMi's nvidia.com/* resources -> ResourceClaimTemplates (webhook/hami_resources.py, /mutate-hami).

Expected shapes follow HAMi's derivation (../shared/reference/hami-policy-semantics.md section 5):
limits win, a count alone is a whole exclusive card, a memory slice is shareable, percentages are
per card and 0 means unset, out-of-range percentages are rejected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from dra_driver.contract import DeviceId
from dra_driver.controller.hami_annotation import encode_devices_allocated
from dra_driver.engine import GpuCard
from dra_driver.resource.objects import ClaimView, PodView
from dra_driver.resource.refs import AllocationResult
from dra_driver.webhook.admission import translate_hami_pod
from dra_driver.webhook.hami_resources import (
    TEMPLATE_LABEL,
    TRANSLATED_ANNOTATION,
    Shape,
    TranslationError,
    apply_patch,
    claim_name,
    pod_token,
    shape_of,
    templates_for_pod,
    translate_pod,
)

DRIVER = "gpu.hami.io"


def results(claims: Mapping[str, Any]) -> dict[str, tuple[AllocationResult, ...]]:
    """The pod claim name -> allocation results map the controller hands the encoder."""
    return {name: ClaimView(claim, DRIVER).results for name, claim in claims.items()}


def seed_pod(**annotations: str) -> dict[str, Any]:
    """The seed's example Pod, verbatim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "inference-latency-tier",
            "annotations": {"hami.io/gpu-scheduler-policy": "mutex,binpack,numa", **annotations},
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "ubuntu:22.04",
                    "command": ["bash", "-c", "sleep 86400"],
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}},
                }
            ]
        },
    }


def review(pod: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "namespace": "team",
        "operation": "CREATE",
        "object": pod,
    } | extra


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"nvidia.com/gpu": 1}, Shape(1, None, None, 100)),  # whole card, exclusive
        ({"nvidia.com/gpu": "2"}, Shape(2, None, None, 100)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}, Shape(1, 8000, None, 0)),  # shareable
        ({"nvidia.com/gpumem": "3000"}, Shape(1, 3000, None, 0)),  # memory alone: one GPU
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, Shape(1, None, 50, 0)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}, Shape(1, None, None, 100)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0}, Shape(1, None, None, 100)),  # 0 = unset
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4000},
         Shape(1, 4000, None, 30)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 0}, Shape(1, None, None, 0)),  # cores given: kept
        ({"nvidia.com/gpucores": 250}, Shape(1, None, None, 100)),  # clamped as HAMi's Fit does
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000, "nvidia.com/gpumem-percentage": 30},
         Shape(1, 2000, None, 0)),  # MiB wins over the percentage
        ({"nvidia.com/gpu": 0}, None),
    ],
)  # fmt: skip
def test_hami_derivation(values: dict[str, Any], expected: Shape | None) -> None:
    assert shape_of("app", values) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101}, "must be within 0..100, got 101"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": -5}, "must be within 0..100, got -5"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1.5"}, "must be a whole number"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "lots"}, "is not a number"),
        ({"nvidia.com/gpu": -1}, "must not be negative"),
    ],
)
def test_hami_rejections_name_the_container_and_resource(values: dict[str, Any], message: str) -> None:
    with pytest.raises(TranslationError, match=message) as err:
        shape_of("app", values)
    assert "container app" in str(err.value)


def test_limits_win_over_requests_per_resource() -> None:
    pod = seed_pod()
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpumem": 8000},
        "requests": {"nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 20, "cpu": "1"},
    }
    translation = translate_pod(pod, "team", DRIVER, DRIVER)
    assert translation is not None
    assert [t["metadata"]["name"] for t in translation.templates] == ["hami-1gpu-8000mi-20cores"]
    resources = apply_patch(pod, translation.patch)["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "1"}, "claims": [{"name": "hami-app"}]}


TOKEN = pod_token("u")  # the review's UID in review()
SEED_TEMPLATE = f"hami-1gpu-8000mi-0cores-{TOKEN}"


def test_the_seed_pod_becomes_a_template_claim_and_is_gated() -> None:
    verdict = translate_hami_pod(review(seed_pod()), DRIVER, DRIVER)
    assert verdict.allowed, verdict.message
    assert verdict.patch is not None
    mutated = apply_patch(seed_pod(), verdict.patch)
    spec = mutated["spec"]
    assert spec["resourceClaims"] == [{"name": "hami-app", "resourceClaimTemplateName": SEED_TEMPLATE}]
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "hami-app"}]}
    assert spec["schedulingGates"] == [{"name": "gpu.hami.io/allocation"}]
    annotations = mutated["metadata"]["annotations"]
    assert annotations["hami.io/gpu-scheduler-policy"] == "mutex,binpack,numa", "HAMi's annotations stay"
    assert f'"template":"{SEED_TEMPLATE}"' in annotations[TRANSLATED_ANNOTATION]


def test_the_template_the_pod_names_is_made_from_the_stored_pod_and_owned_by_it() -> None:
    """What the controller creates (templates_for_pod) from the pod the webhook's patch produced."""
    verdict = translate_hami_pod(review(seed_pod()), DRIVER, DRIVER)
    assert verdict.patch is not None
    stored = apply_patch(seed_pod(), verdict.patch)
    stored["metadata"] |= {"namespace": "team", "uid": "pod-uid"}
    (template,) = templates_for_pod(stored, DRIVER, DRIVER)
    assert template["metadata"]["name"] == SEED_TEMPLATE
    assert template["metadata"]["namespace"] == "team", "the pod's own namespace, nothing else"
    assert template["metadata"]["labels"][TEMPLATE_LABEL] == "hami-1gpu-8000mi-0cores"
    assert template["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "inference-latency-tier", "uid": "pod-uid"}
    ]
    assert template["spec"]["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": DRIVER,
                "count": 1,
                "capacity": {"requests": {"cores": "0", "memory": "8000Mi"}},
            },
        }
    ]


def test_each_review_names_templates_of_its_own() -> None:
    """Two pods of one shape never share a template: each is owned by (and deleted with) its pod."""
    first = translate_hami_pod(review(seed_pod(), uid="a"), DRIVER, DRIVER).patch
    second = translate_hami_pod(review(seed_pod(), uid="b"), DRIVER, DRIVER).patch
    assert first is not None and second is not None
    names = [apply_patch(seed_pod(), p)["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
             for p in (first, second)]  # fmt: skip
    assert names[0] != names[1] and all(n.startswith("hami-1gpu-8000mi-0cores-") for n in names)
    assert len(pod_token()) == 10 and pod_token() != pod_token(), "random without a review UID"


def stored_pod(**changes: Any) -> dict[str, Any]:
    verdict = translate_hami_pod(review(seed_pod()), DRIVER, DRIVER)
    assert verdict.patch is not None
    pod = apply_patch(seed_pod(), verdict.patch)
    pod["metadata"] |= {"namespace": "team", "uid": "pod-uid"}
    summary = json.loads(pod["metadata"]["annotations"][TRANSLATED_ANNOTATION])
    summary["app"] |= changes
    pod["metadata"]["annotations"][TRANSLATED_ANNOTATION] = json.dumps(summary)
    return pod


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"template": "other"}, "claim hami-app is not made from template other"),
        ({"claim": "gpu"}, "claim gpu is not made from template"),
        ({"from": {"nvidia.com/gpu": "4"}}, "is not named after the shape its resources give (hami-4gpu"),
        ({"from": {"nvidia.com/gpumem-percentage": "120"}}, "must be within 0..100"),
        ({"from": None}, "container app has no 'from'"),
    ],
)
def test_an_annotation_that_does_not_match_the_pods_claims_makes_no_template(
    changes: dict[str, Any], message: str
) -> None:
    """Anyone can write the annotation into a pod of their own: it only ever describes the claims
    the pod names, with shapes HAMi would accept."""
    with pytest.raises(TranslationError, match=re.escape(message)):
        templates_for_pod(stored_pod(**changes), DRIVER, DRIVER)


def test_pods_without_the_annotation_need_no_template() -> None:
    assert templates_for_pod(seed_pod(), DRIVER, DRIVER) == []
    pod = seed_pod(**{TRANSLATED_ANNOTATION: "not json"})
    with pytest.raises(TranslationError, match="is not JSON"):
        templates_for_pod(pod, DRIVER, DRIVER)


def test_a_pod_bound_to_a_node_is_refused_not_left_waiting() -> None:
    pod = seed_pod()
    pod["spec"]["nodeName"] = "node-1"
    verdict = translate_hami_pod(review(pod), DRIVER, DRIVER)
    assert not verdict.allowed and "spec.nodeName" in verdict.message


def test_a_pod_with_other_gates_gets_ours_appended() -> None:
    pod = seed_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    verdict = translate_hami_pod(review(pod), DRIVER, DRIVER)
    assert verdict.patch is not None
    gates = apply_patch(pod, verdict.patch)["spec"]["schedulingGates"]
    assert gates == [{"name": "example.com/wait"}, {"name": "gpu.hami.io/allocation"}]


def test_percentages_travel_as_gpuconfig() -> None:
    pod = seed_pod()
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}
    }
    translation = translate_pod(pod, "team", DRIVER, DRIVER)
    assert translation is not None
    (template,) = translation.templates
    devices = template["spec"]["spec"]["devices"]
    assert "memory" not in devices["requests"][0]["exactly"]["capacity"]["requests"]
    assert devices["config"][0]["opaque"]["parameters"]["memoryPercent"] == 25
    from dra_driver.config import parse_gpu_config

    assert parse_gpu_config(devices["config"][0]["opaque"]["parameters"]).memoryPercent == 25


def test_each_container_gets_its_own_claim_and_same_shapes_share_a_template() -> None:
    pod = seed_pod()
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [
        first,
        {**first, "name": "sidecar"},
        {"name": "no-gpu", "image": "x"},
    ]
    pod["spec"]["initContainers"] = [
        {"name": "warmup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    ]
    translation = translate_pod(pod, "team", DRIVER, DRIVER)
    assert translation is not None
    assert sorted(t["metadata"]["name"] for t in translation.templates) == [
        "hami-1gpu-8000mi-0cores",
        "hami-1gpu-whole-100cores",
    ]
    mutated = apply_patch(pod, translation.patch)
    assert [c["name"] for c in mutated["spec"]["resourceClaims"]] == [
        "hami-warmup",
        "hami-app",
        "hami-sidecar",
    ]
    assert mutated["spec"]["containers"][2] == {"name": "no-gpu", "image": "x"}


def test_pods_without_hami_resources_are_untouched() -> None:
    pod = seed_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    verdict = translate_hami_pod(review(pod), DRIVER, DRIVER)
    assert verdict.allowed and verdict.patch is None


def test_rejections_deny_the_pod_with_hamis_meaning() -> None:
    pod = seed_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = 120
    verdict = translate_hami_pod(review(pod), DRIVER, DRIVER)
    assert not verdict.allowed
    assert "nvidia.com/gpumem-percentage must be within 0..100, got 120" in verdict.message


def test_dry_run_gets_the_same_translation() -> None:
    dry = translate_hami_pod(review(seed_pod(), dryRun=True), DRIVER, DRIVER)
    assert dry.allowed and dry.patch == translate_hami_pod(review(seed_pod()), DRIVER, DRIVER).patch


def test_claim_names_are_dns_labels_unique_per_container() -> None:
    long_a, long_b = "a" * 60 + "x", "a" * 60 + "y"
    assert len(claim_name(long_a)) <= 63 and claim_name(long_a) != claim_name(long_b)
    assert claim_name("app") == "hami-app"


def test_vgpu_devices_allocated_is_hamis_encoding() -> None:
    pod = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"claims": [{"name": "hami-a"}]}},
                {"name": "b"},
                {"name": "c", "resources": {"claims": [{"name": "hami-c"}]}},
            ]
        }
    }

    def claim(*devices: tuple[str, str | None, str | None]) -> dict[str, Any]:
        """Shares (shareID + consumedCapacity), or a whole card (neither) where memory is None."""
        results: list[dict[str, Any]] = [
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": d}
            if m is None else
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": d,
             "shareID": f"00000000-0000-0000-0000-00000000000{d[-1]}",
             "consumedCapacity": {"memory": m, "cores": c}}
            for d, m, c in devices
        ]  # fmt: skip
        return {"status": {"allocation": {"devices": {"results": results}}}}

    claims = {
        "hami-a": claim(("gpu-2", "8000Mi", "0")),
        "hami-c": claim(("gpu-0", "15Gi", "100"), ("gpu-1", "1Gi", "30")),
    }

    def card_of(device: DeviceId) -> GpuCard:
        assert device.driver == DRIVER and device.pool == "n1"
        index = int(device.device.split("-")[1])
        return GpuCard(node=device.pool, index=index, memory=15360 * 2**20, uuid=f"GPU-{device.device}")

    value = encode_devices_allocated(PodView(pod), results(claims), DRIVER, card_of)
    assert value == "GPU-gpu-2,NVIDIA,8000,0:;;GPU-gpu-0,NVIDIA,15360,100:GPU-gpu-1,NVIDIA,1024,30:;"
    assert encode_devices_allocated(PodView(pod), {}, DRIVER, lambda device: None) is None
    # A result without shareID takes the whole card: all of its memory and compute.
    whole = {"hami-a": claim(("gpu-3", None, None))}
    assert (
        encode_devices_allocated(PodView(pod), results(whole), DRIVER, card_of)
        == "GPU-gpu-3,NVIDIA,15360,100:;;;"
    )
