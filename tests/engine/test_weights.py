import pytest

from dra_driver.engine import ScoringWeights, WeightsError, parse_scoring_weights
from dra_driver.engine.weights import MAX_WEIGHT


def test_parse_any_order_with_spaces() -> None:
    assert parse_scoring_weights(" memory = 3, slot=1 ,core=0") == ScoringWeights(slot=1, core=0, memory=3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slot=1,core=1", "expected slot, core, and memory weights"),
        ("slot=1,core=1,memory=1,bandwidth=2", "expected slot, core, and memory weights"),
        ("slot=1,core,memory=1", "expected key=value entries"),
        ("slot=1,core=x,memory=1", '"core" weight must be an integer'),
        ("slot=1,core=1.5,memory=1", '"core" weight must be an integer'),
        ("slot=1,core=-1,memory=1", '"core" weight must not be negative'),
        ("slot=1,bandwidth=1,memory=1", 'unknown weight "bandwidth"'),
        ("slot=1,slot=1,memory=1", 'duplicate "slot" weight'),
        ("slot=0,core=0,memory=0", "at least one weight must be positive"),
    ],
)
def test_hami_error_messages(text: str, message: str) -> None:
    with pytest.raises(WeightsError, match=message):
        parse_scoring_weights(text)


def test_constructor_validates_too() -> None:
    with pytest.raises(WeightsError, match="at least one weight must be positive"):
        ScoringWeights(0, 0, 0)
    with pytest.raises(WeightsError, match='"memory" weight must not be negative'):
        ScoringWeights(1, 1, -1)


@pytest.mark.parametrize(
    "slot",
    ["1000001", "1" + "0" * 400, "9" * 4301, "+0001000001"],
)
def test_weights_over_the_bound_are_refused_before_scoring(slot: str) -> None:
    """A weight over MAX_WEIGHT would overflow the float32 score (or int() itself, past 4300 digits)."""
    with pytest.raises(WeightsError, match=f'"slot" weight must be at most {MAX_WEIGHT}') as raised:
        parse_scoring_weights(f"slot={slot},core=1,memory=1")
    assert len(str(raised.value)) < 200  # the tenant's value is quoted shortened


def test_the_bound_itself_and_leading_zeros_are_accepted() -> None:
    assert parse_scoring_weights(f"slot=000{MAX_WEIGHT},core=1,memory=1").slot == MAX_WEIGHT
    with pytest.raises(WeightsError, match="at most"):
        ScoringWeights(MAX_WEIGHT + 1, 1, 1)
