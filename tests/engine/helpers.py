"""Small builders shared by the engine tests."""

from __future__ import annotations

from dra_driver.engine import (
    MIB,
    ClusterState,
    DeviceShare,
    GpuCard,
    Placement,
    PlacementRequest,
    parse_node_policy,
    parse_policy_chain,
)

T4_MEMORY = 15360 * MIB


def t4(index: int, node: str = "node-1", numa: int | None = 0, **kwargs: object) -> GpuCard:
    return GpuCard(
        node=node, index=index, memory=T4_MEMORY, product_name="Tesla T4", numa_node=numa, **kwargs
    )  # type: ignore[arg-type]


def tenants(
    state: ClusterState, node: str, index: int, count: int, memory_mib: int = 1000, cores: int = 0
) -> None:
    for _ in range(count):
        state.allocate(Placement(node, (DeviceShare(index=index, memory=memory_mib * MIB, cores=cores),)))


def request(policy: str | None = None, memory_mib: int | None = 1000, **kwargs: object) -> PlacementRequest:
    node_policy = kwargs.pop("node_policy", None)
    return PlacementRequest(
        name=str(kwargs.pop("name", "req")),
        policy=parse_policy_chain(policy),
        node_policy=parse_node_policy(node_policy if isinstance(node_policy, str) else None),
        memory=None if memory_mib is None else memory_mib * MIB,
        **kwargs,  # type: ignore[arg-type]
    )


def worked_example() -> ClusterState:
    """The seed's lab: four T4s; GPU0 two 1000 MiB tenants, GPU1 one, GPU2 and GPU3 idle."""
    state = ClusterState([t4(i) for i in range(4)])
    tenants(state, "node-1", 0, 2)
    tenants(state, "node-1", 1, 1)
    return state
