"""How ``FakeKube`` applies a PATCH: the three kinds our controller sends, as kube-apiserver does,
by the sandbox's own rules (``hami_dra_dev/patching.py``); a refusal is the ``KubeError`` our
client raises for the server's.

A strategic merge directive (``$patch``, ``$retainKeys``, ...) is refused: none of our controller's
patches carries one, so one in a test is a mistake of the test.

The real server's answers to the binder's patches are checked against these in
tests/controller/test_fake_patch.py (on the API server tier) and tests/cluster/test_pod_patches.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.kube.errors import KubeError
from hami_dra_dev import patching
from hami_dra_dev.patching import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, PatchError

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "apply_patch",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]


def _as_kube_error(apply: Callable[[Any, Any], Any], target: Any, patch: Any) -> Any:
    try:
        return apply(target, patch)
    except PatchError as err:
        raise KubeError(err.status, err.message) from None


def _refuse_directives(patch: Any) -> None:
    if isinstance(patch, list):
        for item in patch:
            _refuse_directives(item)
    elif isinstance(patch, dict):
        for key, value in patch.items():
            if key.startswith("$"):
                raise ValueError(f"FakeKube does not apply the strategic merge directive {key!r}")
            _refuse_directives(value)


def apply_patch(content_type: str, target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` applied (``target`` untouched); KubeError as the server answers."""
    if content_type.split(";")[0].strip() == STRATEGIC_PATCH:
        _refuse_directives(patch)
    return _as_kube_error(lambda t, p: patching.apply_patch(content_type, t, p), target, patch)


def merge_patch(target: Any, patch: Any) -> Any:
    return _as_kube_error(patching.merge_patch, target, patch)


def json_patch(target: Any, ops: Any) -> Any:
    return _as_kube_error(patching.json_patch, target, ops)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    _refuse_directives(patch)
    return _as_kube_error(patching.strategic_merge_patch, target, patch)
