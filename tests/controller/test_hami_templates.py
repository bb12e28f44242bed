"""The controller makes the templates of HAMi-translated pods (controller/hami_templates.py): from the
pod as stored, in its own namespace, owned by it, only where translation is on; the webhook makes
none (tests/webhook/test_optin.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.hami_templates import (
    NAMESPACES,
    TEMPLATES,
    HamiTemplates,
    KubeNamespaces,
    made_annotation,
)
from dra_driver.controller.pod_queue import Step
from dra_driver.kube.api import PODS
from dra_driver.resource.objects import PodView
from dra_driver.webhook.admission import translate_hami_pod
from dra_driver.webhook.hami_resources import NAMESPACE_LABEL, TRANSLATED_ANNOTATION, apply_patch
from dra_driver.webhook.optin import namespace_gate
from tests.controller.fake_kube import FakeKube
from tests.controller.harness import NS
from tests.controller.worlds import World
from tests.webhook.test_hami_resources import review, seed_pod

DRIVER = "gpu.hami.io"


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.put(NAMESPACES, {"metadata": {"name": "team", "labels": {NAMESPACE_LABEL: "enabled"}}})
    kube.put(NAMESPACES, {"metadata": {"name": "other"}})
    return kube


def maker(kube: FakeKube) -> HamiTemplates:
    return HamiTemplates(kube, DRIVER, DRIVER, namespace_gate("namespaces", {}, KubeNamespaces(kube)))


def translated_pod(kube: FakeKube, namespace: str = "team", name: str = "inference") -> PodView:
    """A pod as the API server stores it after /mutate-hami's patch."""
    verdict = translate_hami_pod(review(seed_pod(), uid=f"{namespace}-{name}"), DRIVER, DRIVER)
    assert verdict.patch is not None
    pod: dict[str, Any] = apply_patch(seed_pod(), verdict.patch)
    pod["metadata"] |= {"name": name, "namespace": namespace}
    return PodView(kube.put(PODS, pod))


def template_names(kube: FakeKube) -> list[tuple[str, str]]:
    return sorted((ns, name) for (plural, ns, name) in kube.objects if plural == "resourceclaimtemplates")


def test_the_pods_template_is_made_owned_by_it_and_the_pod_is_marked(kube: FakeKube) -> None:
    pod = translated_pod(kube)
    templates = maker(kube)
    assert templates.ensure(pod) is None
    (key,) = template_names(kube)
    name = str(pod.claim_entries[0].template)
    assert key == ("team", name)
    stored = kube.stored(TEMPLATES, "team", name)
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "inference", "uid": pod.uid}
    ], "the garbage collector deletes it with the pod"
    assert stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
        "cores": "0",
        "memory": "8000Mi",
    }
    marked = kube.stored(PODS, "team", "inference")
    woken = marked["metadata"]["annotations"][made_annotation(DRIVER)] == name
    assert woken, "kcm's claim controller is woken"
    calls = len(kube.calls)
    assert templates.ensure(pod) is None and len(kube.calls) == calls, "once per pod"


def test_two_pods_of_one_shape_get_templates_of_their_own(kube: FakeKube) -> None:
    templates = maker(kube)
    for name in ("a", "b"):
        assert templates.ensure(translated_pod(kube, name=name)) is None
    owners = [kube.stored(TEMPLATES, ns, name)["metadata"]["ownerReferences"][0]["name"]
              for ns, name in template_names(kube)]  # fmt: skip
    assert sorted(owners) == ["a", "b"]


@pytest.mark.parametrize(
    ("namespace", "reason"),
    [("other", "namespace other has not opted in"), ("gone", "namespace gone does not exist")],
)
def test_no_template_where_translation_is_not_turned_on(kube: FakeKube, namespace: str, reason: str) -> None:
    """Anyone may write the translation's annotation into a pod of their own namespace."""
    problem = maker(kube).ensure(translated_pod(kube, namespace=namespace))
    assert problem is not None and reason in problem
    assert template_names(kube) == []


def test_an_annotation_that_lies_makes_nothing(kube: FakeKube) -> None:
    pod = translated_pod(kube)
    raw = kube.stored(PODS, "team", "inference")
    raw["metadata"]["annotations"][TRANSLATED_ANNOTATION] = raw["metadata"]["annotations"][
        TRANSLATED_ANNOTATION
    ].replace('"8000"', '"16000"')
    problem = maker(kube).ensure(PodView(raw))
    assert problem is not None and "not named after the shape" in problem
    assert template_names(kube) == [] and pod.uid


def test_pods_without_the_annotation_are_left_alone(kube: FakeKube) -> None:
    pod = PodView(kube.put(PODS, {**seed_pod(), "metadata": {"name": "plain", "namespace": "team"}}))
    assert maker(kube).ensure(pod) is None
    assert kube.calls == []


def test_a_template_that_exists_already_is_not_an_error(kube: FakeKube) -> None:
    pod = translated_pod(kube)
    name = str(pod.claim_entries[0].template)
    kube.put(TEMPLATES, {"metadata": {"name": name, "namespace": "team"}, "spec": {"spec": {}}})
    assert maker(kube).ensure(pod) is None
    assert made_annotation(DRIVER) not in kube.stored(PODS, "team", "inference")["metadata"]["annotations"]


def test_an_api_error_propagates_and_the_pod_is_tried_again(kube: FakeKube) -> None:
    pod = translated_pod(kube)
    templates = maker(kube)
    kube.fail("create", "resourceclaimtemplates", 403, "forbidden")
    with pytest.raises(Exception, match="forbidden"):
        templates.ensure(pod)
    assert templates.ensure(pod) is None
    assert len(template_names(kube)) == 1


# --- in the worker: a gated pod waiting for its template claim -------------------------------------


def world_with_templates(opted_in: bool) -> World:
    world = World()
    labels = {NAMESPACE_LABEL: "enabled"} if opted_in else {}
    world.kube.put(NAMESPACES, {"metadata": {"name": NS, "labels": labels}})
    world.controller.hami_templates = maker(world.kube)
    verdict = translate_hami_pod(review(seed_pod(), uid="w"), DRIVER, DRIVER)
    assert verdict.patch is not None
    translated = apply_patch(seed_pod(), verdict.patch)
    translated["metadata"] |= {"name": "hami", "namespace": NS}
    world.add_pod(translated)
    return world


def test_the_worker_makes_the_template_of_a_pod_waiting_for_its_claim() -> None:
    world = world_with_templates(opted_in=True)
    assert world.controller.schedule_one(world.pod_view("hami")) is Step.WAITING
    assert [name for ns, name in template_names(world.kube) if ns == NS] == [
        world.pod_view("hami").claim_entries[0].template
    ]
    assert world.condition("hami") is None, "waiting for kcm's claim is not pending"


def test_the_worker_reports_a_pod_whose_namespace_did_not_opt_in() -> None:
    world = world_with_templates(opted_in=False)
    assert world.controller.schedule_one(world.pod_view("hami")) is Step.WAITING
    assert world.condition("hami") is None, "reported after the pass, off the planning path"
    world.controller.failures.handle()
    assert template_names(world.kube) == []
    found = world.condition("hami")
    assert found is not None and found["reason"] == "InvalidRequest"
    assert "has not opted in to HAMi resource translation" in found["message"]
