"""The ResourceClaimTemplates of HAMi-translated pods, made from pods that exist.

``/mutate-hami`` rewrites a pod's ``nvidia.com/*`` resources into claims from templates it names
but does not create (webhook/hami_resources.py): the webhook's Service answers any caller, and a
hand-made review must not write anything with the webhook's rights. Such a pod is gated and waits
for its claims; kube-controller-manager makes them once the templates exist. Here the controller,
seeing the pod the API server stored, creates them:

- in the pod's own namespace, only where HAMi translation is turned on (``NamespaceGate``, the
  webhook configuration's selector): the annotation is only the pod's word, and anyone may write
  it into a pod of their own;
- owned by the pod, so the garbage collector deletes them with it: no template outlives the pods
  using it, and there is no per-namespace count for anyone to exhaust;
- then it marks the pod (``<driver>/hami-templates``), which makes kube-controller-manager look
  at the pod again at once instead of after the backoff its failed attempts earned.

A pod whose annotation does not match its claims, or whose namespace did not opt in, is reported
pending with the reason, like any pod the controller cannot place.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping

from dra_driver.kube.api import PODS, KubeApi, Resource
from dra_driver.kube.errors import KubeError
from dra_driver.resource.objects import PodView
from dra_driver.webhook.hami_resources import TRANSLATED_ANNOTATION, TranslationError, templates_for_pod
from dra_driver.webhook.lookup import TtlCache
from dra_driver.webhook.optin import NamespaceGate

log = logging.getLogger(__name__)

TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)


def made_annotation(driver: str) -> str:
    """Pod annotation: the templates the controller made for the pod (also what wakes kcm up);
    named by the driver like the decision record, so two installs never read each other's."""
    return f"{driver}/hami-templates"


#: Pods remembered as done; beyond, the oldest are forgotten (a second try only meets 409s).
REMEMBERED_PODS = 4096


class KubeNamespaces:
    """Namespace labels read from the API (``NamespaceReader``), kept ``ttl`` seconds."""

    def __init__(self, kube: KubeApi, ttl: float = 10.0) -> None:
        self._kube = kube
        self._cache: TtlCache[dict[str, str] | None] = TtlCache(ttl)

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        def load() -> dict[str, str] | None:
            try:
                namespace = self._kube.get(NAMESPACES, None, name)
            except KubeError as err:
                if err.not_found:
                    return None
                raise
            return dict((namespace.get("metadata") or {}).get("labels") or {})

        return self._cache.get(name, load)


class HamiTemplates:
    """Creates a translated pod's templates (``ensure``); API errors propagate (retried later)."""

    def __init__(self, kube: KubeApi, driver: str, device_class: str, gate: NamespaceGate) -> None:
        self._kube = kube
        self._driver = driver
        self._device_class = device_class
        self._gate = gate
        self._done: OrderedDict[str, None] = OrderedDict()

    def ensure(self, pod: PodView) -> str | None:
        """Make the templates ``pod`` waits for; the reason it cannot have them, or None.

        Only pods carrying the translation's annotation are looked at, once each.
        """
        if TRANSLATED_ANNOTATION not in pod.annotations or pod.uid in self._done:
            return None
        refusal = self._gate.refusal(pod.namespace)
        if refusal is not None:
            return f"{refusal}; no ResourceClaimTemplate is made for it"
        try:
            templates = templates_for_pod(pod.raw, self._device_class, self._driver)
        except TranslationError as err:
            return str(err)
        made = []
        for template in templates:
            name = template["metadata"]["name"]
            try:
                self._kube.create(TEMPLATES, pod.namespace, template)
                made.append(name)
            except KubeError as err:
                if not err.conflict:
                    raise
        if made:
            log.info("pod %s: created ResourceClaimTemplates %s", pod.key, ", ".join(made))
            self._wake_claim_controller(pod, [t["metadata"]["name"] for t in templates])
        self._done[pod.uid] = None
        while len(self._done) > REMEMBERED_PODS:
            self._done.popitem(last=False)
        return None

    def _wake_claim_controller(self, pod: PodView, names: list[str]) -> None:
        """Note the templates on the pod: an update is what makes kcm's claim controller retry it now.

        Best effort, and a merge patch of one annotation (with the pod's uid, which a pod of the
        same name that is another object refuses): the informer keeps pods slim
        (dra_driver/controller/slim.py), so an Update of the copy we hold would erase what it
        leaves out.
        """
        mark = {made_annotation(self._driver): ",".join(names)}
        patch = {"metadata": {"uid": pod.uid, "annotations": mark}}
        try:
            self._kube.patch(PODS, pod.namespace, pod.name, patch)
        except KubeError as err:
            log.info("pod %s: not marked after creating its templates: %s", pod.key, err)
