"""Locating ../shared/reference/upstream (beside the repo) for tests that compare with kubelet's protos."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = REPO_ROOT / ".." / "shared"
UPSTREAM_KUBELET = SHARED / "reference" / "upstream" / "kubernetes" / "kubelet"
CDI_SCHEMA_DIR = SHARED / "reference" / "upstream" / "cncf-tags" / "container-device-interface" / "schema"


def require_upstream() -> Path:
    """The upstream kubelet proto root, or skip the test with the reason."""
    if not (UPSTREAM_KUBELET / "pkg" / "apis" / "dra" / "v1" / "api.proto").is_file():
        pytest.skip(
            f"upstream kubelet protos not found at {UPSTREAM_KUBELET.resolve()} (../shared is absent)"
        )
    return UPSTREAM_KUBELET
