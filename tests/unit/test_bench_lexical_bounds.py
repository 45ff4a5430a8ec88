"""bench.scale.lexical_bounds' model of lexical_hits_pruned's work, and the bounds it compares."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from bench.scale.lexical_bounds import Cost, bm25_bounds, cheapest, modelled_cost
from pipelines.domain.lexical import LexicalParams

# A common term (10 chunks, low scores) and a rare one (3 chunks, high scores), the walk's cut at 2.
COMMON = {f"c{i}": 0.5 for i in range(10)}
RARE = {"c0": 3.0, "c1": 2.0, "c2": 0.1}
CONTRIBUTIONS = {1: COMMON, 2: RARE}


def test_a_common_term_under_theta_is_probed_for_the_chunks_still_in_reach():
    # theta = the rare term's 2nd best (2.0); the common term adds at most 0.6: c0 and c1 stay in reach, c2 does not.
    cost = modelled_cost(CONTRIBUTIONS, [1], {1: 0.6, 2: 9.0}, cut=2, probe_cost=3)
    assert cost == Cost(postings=3 + min(10, 3 * 2), lazy=1, kept=2)


def test_a_bound_that_reaches_theta_leaves_nothing_lazy():
    assert modelled_cost(CONTRIBUTIONS, [1], {1: 2.5, 2: 9.0}, cut=2) is None


def test_walked_terms_that_rank_fewer_chunks_than_the_cut_cannot_prune():
    # Three chunks hold the rare term, the cut is 4: theta is 0, so every chunk with only the common term could rank.
    assert modelled_cost(CONTRIBUTIONS, [1], {1: 0.6, 2: 9.0}, cut=4) is None


def test_probing_costs_no_more_than_walking_the_lazy_terms():
    cost = modelled_cost(CONTRIBUTIONS, [1], {1: 0.6, 2: 9.0}, cut=2, probe_cost=100)
    assert cost is not None and cost.postings == 3 + 10


def test_the_cheapest_choice_is_the_walk_when_nothing_prunes():
    assert cheapest(CONTRIBUTIONS, {1: 5.0, 2: 9.0}, cut=2) == Cost(postings=13, lazy=0, kept=2)
    assert cheapest(CONTRIBUTIONS, {1: 0.6, 2: 9.0}, cut=2).lazy == 1


postings = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.integers(0, 40), st.integers(1, 20), st.integers(1, 400)),
                    min_size=1, max_size=80, unique_by=lambda p: (p[0], p[1]))


@given(postings, st.floats(20, 300))
def test_each_bound_holds_every_contribution_and_they_tighten_in_order(rows, avg_length):
    """idf x (k1 + 1) >= the stored bound (largest tf, smallest length / tf) >= each term's exact largest."""
    rows = [(term, f"c{chunk}", tf, max(length, tf)) for term, chunk, tf, length in rows]
    idfs = {1: 0.4, 2: 2.0, 3: 7.5}
    params = LexicalParams.of({})
    contributions, bounds = bm25_bounds(idfs, rows, avg_length, params)
    for term, scores in contributions.items():
        for score in scores.values():
            assert score <= bounds["exact"][term] + 1e-12
        assert bounds["exact"][term] <= bounds["stored"][term] + 1e-9 or math.isclose(
            bounds["exact"][term], bounds["stored"][term])
        assert bounds["stored"][term] <= bounds["idf"][term] + 1e-12
