import pytest

from dra_driver.engine import NodePolicy, Policy, parse_node_policy, parse_policy_chain


def test_chain_is_split_trimmed_and_deduplicated() -> None:
    chain = parse_policy_chain(" mutex , binpack,mutex,  numa ,binpack")
    assert chain.policies == (Policy.MUTEX, Policy.BINPACK, Policy.NUMA)
    assert chain.text == "mutex,binpack,numa"
    assert chain.unknown == ()


def test_unknown_names_are_reported_and_ignored() -> None:
    chain = parse_policy_chain("binpack,fastest,Spread,fastest")
    assert chain.policies == (Policy.BINPACK,)
    assert chain.unknown == ("fastest", "Spread")  # case-sensitive, like HAMi


def test_filters_and_sort_keys_are_separated() -> None:
    chain = parse_policy_chain("mutex,topology-aware,spread")
    assert chain.mutex and chain.topology_aware
    assert chain.sort_keys == (Policy.SPREAD,)


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("binpack", (Policy.BINPACK, Policy.NUMA)),  # single value: #2012, numa breaks ties
        ("spread", (Policy.SPREAD, Policy.NUMA)),
        ("mutex", (Policy.SPREAD, Policy.NUMA)),
        ("numa", (Policy.NUMA,)),
        ("mutex,topology-aware", (Policy.SPREAD,)),  # filter-only fallback
        ("foo,bar", (Policy.SPREAD,)),
        ("numa,binpack", (Policy.NUMA, Policy.BINPACK)),
        ("binpack,numa", (Policy.BINPACK, Policy.NUMA)),
        ("mutex,binpack", (Policy.BINPACK,)),
    ],
)
def test_effective_sort_keys(text: str, keys: tuple[Policy, ...]) -> None:
    assert parse_policy_chain(text).sort_keys == keys


def test_missing_policy_uses_default_spread_but_empty_string_does_not() -> None:
    assert parse_policy_chain(None).policies == (Policy.SPREAD,)
    assert parse_policy_chain("").policies == ()
    assert parse_policy_chain("").sort_keys == (Policy.SPREAD,)


def test_node_policy() -> None:
    assert parse_node_policy(None) is NodePolicy.BINPACK
    assert parse_node_policy(" spread ") is NodePolicy.SPREAD
    with pytest.raises(ValueError, match="unknown node policy 'mutex'"):
        parse_node_policy("mutex")
