import pytest

from dra_driver.engine import MIB, CardUsage, ScoringWeights, card_score, node_score, usage_score
from dra_driver.engine.score import f32
from tests.engine.helpers import t4


@pytest.mark.parametrize(("tenants", "expected"), [(0, 0.0), (1, 1.651042), (2, 3.302083)])
def test_seed_t4_scores(tenants: int, expected: float) -> None:
    usage = CardUsage(tenants=tenants, used_memory=tenants * 1000 * MIB)
    assert round(card_score(t4(0), usage), 6) == expected


def test_score_is_float32_like_hami() -> None:
    # 10 * (0.1 + 1000/15360) in float32 is 1.6510416 (float64 would give 1.6510416666...).
    score = usage_score(1, 0, 1000, 10, 100, 15360)
    assert score == f32(1.6510416666666667)
    assert score != 1.6510416666666667


def test_weights_scale_terms() -> None:
    usage = CardUsage(tenants=1, used_cores=50, used_memory=0)
    assert card_score(t4(0), usage, ScoringWeights(slot=0, core=2, memory=1)) == pytest.approx(10.0)
    assert card_score(t4(0), usage, ScoringWeights(slot=1, core=0, memory=0)) == pytest.approx(1.0)


def test_zero_denominator_gives_zero() -> None:
    assert usage_score(1, 1, 1, 0, 100, 100) == 0.0


def test_node_score_sums_all_cards_with_unit_weights() -> None:
    cards = [(t4(0), CardUsage(2, 2000 * MIB, 0)), (t4(1), CardUsage(0, 0, 0))]
    # 10 * (2/20 + 0/200 + 2000/30720)
    assert node_score(cards) == pytest.approx(10 * (0.1 + 2000 / 30720), rel=1e-6)


def test_every_weight_scales_its_own_term_with_all_terms_in_use() -> None:
    """Memory, core and slot weights each change the score (the only other weight test had no memory)."""
    usage = CardUsage(tenants=2, used_cores=30, used_memory=7680 * MIB)  # 2/10 slots, 30/100, 1/2 memory
    card = t4(0)
    assert card_score(card, usage, ScoringWeights(slot=1, core=1, memory=1)) == pytest.approx(
        10 * (0.2 + 0.3 + 0.5)
    )
    assert card_score(
        card,
        CardUsage(tenants=2, used_cores=30, used_memory=7680 * MIB),
        ScoringWeights(slot=0, core=0, memory=3),
    ) == pytest.approx(15.0)
    assert card_score(
        card,
        CardUsage(tenants=2, used_cores=30, used_memory=7680 * MIB),
        ScoringWeights(slot=0, core=2, memory=0),
    ) == pytest.approx(6.0)
    assert card_score(
        card,
        CardUsage(tenants=2, used_cores=30, used_memory=7680 * MIB),
        ScoringWeights(slot=5, core=0, memory=0),
    ) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("slots", "total_cores", "total_memory"), [(0, 100, 100), (10, 0, 100), (10, 100, 0), (1, 0, 100)]
)
def test_any_zero_denominator_gives_zero(slots: int, total_cores: int, total_memory: int) -> None:
    assert usage_score(1, 1, 1, slots, total_cores, total_memory) == 0.0


def test_denominators_of_one_are_real_cards() -> None:
    assert usage_score(1, 1, 1, 1, 1, 1) == pytest.approx(30.0)


def test_card_scores_are_memoised_per_weights_until_usage_changes() -> None:
    usage = CardUsage(tenants=1, used_memory=1000 * MIB)
    first = card_score(t4(0), usage)
    assert usage.scores[ScoringWeights()] == first
    usage.scores[ScoringWeights()] = 42.0  # a memoised value is returned as is
    assert card_score(t4(0), usage) == 42.0


def test_node_score_sums_every_card() -> None:
    cards = [
        (t4(0), CardUsage(tenants=1, used_cores=40, used_memory=1000 * MIB)),
        (t4(1), CardUsage(tenants=2, used_cores=20, used_memory=3000 * MIB)),
    ]
    expected = usage_score(3, 60, 4000 * MIB, 20, 200, 2 * 15360 * MIB)
    assert node_score(cards) == expected
    assert expected == pytest.approx(10 * (3 / 20 + 60 / 200 + 4000 / 30720), rel=1e-6)
