"""Sandbox API server throughput (``pytest -m bench tests/sandbox``; excluded from ``make test``)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from kubernetes import client

from hami_dra_dev.sandbox import SandboxServer
from tests.sandbox.helpers import claim_obj, slice_obj

pytestmark = pytest.mark.bench


def test_bench_server_start(benchmark: Any) -> None:
    def start_stop() -> None:
        with SandboxServer.start():
            pass

    benchmark(start_stop)


def test_bench_create_claim(benchmark: Any, sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    names = (f"c{i}" for i in itertools.count())
    benchmark(
        lambda: res.create_namespaced_resource_claim(
            "default", claim_obj(next(names)), _preload_content=False
        )
    )


def test_bench_get_slice(benchmark: Any, sandbox_client: Any) -> None:
    res = client.ResourceV1Api(sandbox_client)
    res.create_resource_slice(slice_obj("s1", "node-1", devices=8))
    benchmark(lambda: res.read_resource_slice("s1"))
