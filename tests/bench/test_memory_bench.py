"""``hack/bench_memory.py`` at a tiny size: the cluster it generates is the one its controller caches
(every pod, claim and device, each bound pod's CPU once), its fake API server pages and selects as
the real one does. The benchmark reports figures and asserts nothing; what it measures must exist."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dra_driver.kube.api import PODS, RESOURCE_SLICES
from dra_driver.resource.objects import PodView, bound_requests_by_node

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "hack" / "bench_memory.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_memory"] = module
    spec.loader.exec_module(module)
    return module


def test_the_generated_cluster_is_what_the_controller_caches(bench: ModuleType, tmp_path: Path) -> None:
    shape = argparse.Namespace(nodes=3, gpus=2, pods=12, ours=3, other_slices=1)
    sizes = bench.generate(shape, tmp_path)
    assert all(sizes[plural] > 0 for plural in bench.PLURALS)
    api = bench.FakeApi(tmp_path)
    first = api.list(PODS, limit=5)
    rest = api.list(PODS, limit=100, continue_from=first["metadata"]["continue"])
    assert len(first["items"]) == 5 and len(rest["items"]) == 7 and "continue" not in rest["metadata"]
    ours = api.list(RESOURCE_SLICES, field_selector=f"spec.driver={bench.DRIVER}")["items"]
    assert len(ours) == 3 and len(api.list(RESOURCE_SLICES)["items"]) == 6
    controller, _api, listed, ready, cpu = bench.sync(tmp_path, 4, 60.0)
    cache = controller.cache
    assert (len(cache.pods), len(cache.claims), len(cache.nodes)) == (12, 3, 3)
    assert sum(len(node.devices) for node in cache.ledger.inventory.values()) == 6
    assert all(claim.uses for claim in cache.claims.values()), "our claims are counted in the ledger"
    pods = [PodView(bench.a_pod(index, 3, False)) for index in range(12)]
    expected = sum(node["cpu"] for node in bound_requests_by_node(pods).values())
    assert sum(node["cpu"] for node in cache.bound_requests().values()) == pytest.approx(expected)
    assert 0 < listed <= ready and cpu > 0
    for informer in controller.informers.values():
        informer.stop()


def test_managed_fields_follow_the_api_servers_list_types(bench: ModuleType) -> None:
    tree = bench.fields_v1({"containers": [{"name": "app", "image": "x"}], "tolerations": [{"key": "a"}]})
    assert tree == {"f:containers": {'k:{"name":"app"}': {".": {}, "f:name": {}, "f:image": {}}},
                    "f:tolerations": {}}  # fmt: skip
