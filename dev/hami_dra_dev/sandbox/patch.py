"""PATCH bodies as the sandbox serves them: the request's body decoded and applied by
``hami_dra_dev/patching.py`` (JSON merge patch, JSON patch, strategic merge patch with its
directives; the rules the unit tests' ``FakeKube`` applies too), a refusal rendered as the
``ApiError`` the server answers with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hami_dra_dev import patching
from hami_dra_dev.patching import PatchError
from hami_dra_dev.sandbox.errors import ApiError, bad_request

JSON = Any


def _as_api_error(apply: Callable[[JSON, JSON], JSON], target: JSON, patch: JSON) -> JSON:
    try:
        return apply(target, patch)
    except PatchError as err:
        raise ApiError(err.status, err.reason, err.message) from None


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """RFC 7386: objects merge, ``null`` deletes, everything else replaces."""
    return _as_api_error(patching.merge_patch, target, patch)


def json_patch(target: JSON, ops: JSON) -> JSON:
    """RFC 6902 including ``test`` (a failed test is 422 like the real server)."""
    return _as_api_error(patching.json_patch, target, ops)


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    """A strategic merge patch (``hami_dra_dev/patching.py`` says what is supported)."""
    return _as_api_error(patching.strategic_merge_patch, target, patch)


def apply_patch(content_type: str, target: JSON, body: bytes) -> JSON:
    """Dispatch on the request's Content-Type; 415 for anything else (as the real server)."""
    try:
        patch = json.loads(body or b"null")
    except ValueError as err:
        raise bad_request(f"error decoding patch: {err}") from err
    return _as_api_error(lambda t, p: patching.apply_patch(content_type, t, p), target, patch)
