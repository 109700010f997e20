import pytest

from ballast.vocabulary.layouts import ANY_SPLIT, ULYSSES, ULYSSES_ONLY, ulysses_in_node
from ballast.vocabulary.split_catalogue import SplitCatalogue

EXCHANGES = frozenset({2, 4, 8})


def test_degrees_and_splits_follow_heads_rule_and_exchanges():
    # 6 heads: Ulysses runs u = 1, 2 only; CP lifts the cap where the rule allows it
    heads_only = SplitCatalogue(8, 6, ULYSSES, EXCHANGES)
    assert heads_only.degrees == [1, 2] and heads_only.split(2) == 1 and heads_only.context_parts(4) == []
    any_split = heads_only.under(ANY_SPLIT)
    assert any_split.degrees == [1, 2, 4, 8]
    assert any_split.context_parts(4) == [2, 4] and any_split.split(4) == 2
    assert any_split.default_cp(16) == 1             # a degree not offered prices as the head layout
    # no bandwidth at 4: neither u = 4 nor a CP part over 4 ranks
    assert SplitCatalogue(8, 8, ULYSSES, frozenset({2}), rule=ANY_SPLIT).degrees == [1, 2]
    assert SplitCatalogue(8, 8, ULYSSES, EXCHANGES, rule=ulysses_in_node(2)).context_parts(8) == [4]


def test_a_profile_offers_context_parallelism_only_where_it_measured_it():
    measured = SplitCatalogue(4, 8, ULYSSES, frozenset({2, 4}), frozenset({4}), ANY_SPLIT)
    assert measured.context_parts(2) == [1] and measured.context_parts(4) == [1, 2, 4]
    # where no split without CP exists, CP is offered though unmeasured
    assert SplitCatalogue(4, 1, ULYSSES, frozenset({2, 4}), frozenset(), ANY_SPLIT).context_parts(2) == [2]


@pytest.mark.parametrize("world, heads, exchanges, says", [
    (0, 8, EXCHANGES, "world size 0 must be at least 1"),
    (8, 0, EXCHANGES, "heads 0 must be at least 1"),
    (8, 8, frozenset({3}), "exchange degree 3 is not a power of two"),
])
def test_invalid_values_are_named(world, heads, exchanges, says):
    with pytest.raises(ValueError, match=says):
        SplitCatalogue(world, heads, ULYSSES, exchanges, rule=ULYSSES_ONLY)
