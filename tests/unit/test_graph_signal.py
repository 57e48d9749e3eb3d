"""The graph signal's pure part: which names a query can hold, and how reached drawers are weighed."""

from __future__ import annotations

import math

from shared.memory.graph_signal import GraphParams, graph_strengths, query_names
from shared.memory.ranking import Candidate, RankParams, rank


def test_query_names_are_the_linkers_word_runs() -> None:
    names = query_names("What did Ana decide about the Crawbl backend and postgres?")
    # Multi-word runs match any alias; a capitalised word too; a lower-case word only lower-case aliases.
    assert "crawbl backend" in names.any_alias and "ana" in names.any_alias and "crawbl" in names.any_alias
    assert "postgres" in names.uncased_only and "backend" in names.uncased_only
    assert "ana" not in names.uncased_only
    # Runs of stopwords or single letters are never names.
    assert "what did" not in names.any_alias and "the" not in names.uncased_only
    assert not query_names("what is it?") and not query_names("")


def test_query_names_are_bounded_by_max_words() -> None:
    names = query_names("alpha beta gamma delta epsilon", max_words=2)
    assert all(len(k.split()) <= 2 for k in names.any_alias + names.uncased_only)
    assert "alpha beta" in names.any_alias and "alpha beta gamma" not in names.any_alias


def test_rare_entities_select_and_common_ones_do_not() -> None:
    p = GraphParams(max_df=100)
    rows = [("d1", "rare", 0, 2), ("d2", "rare", 0, 2), ("d3", "speaker", 0, 500), ("d1", "speaker", 0, 500)]
    s = graph_strengths(rows, 1000, p)
    assert set(s) == {"d1", "d2"}  # the speaker is in more than max_df drawers: it selects nothing
    assert math.isclose(s["d1"], math.log(1000 / 2) / math.log(1000))


def test_best_entity_not_the_sum_and_a_hop_counts_less() -> None:
    p = GraphParams(hop_factor=0.5)
    one = graph_strengths([("d", "a", 0, 5)], 1000, p)["d"]
    # More entities on one drawer (a richer extractor) do not inflate it.
    many = graph_strengths([("d", "a", 0, 5)] + [("d", f"e{i}", 0, 5) for i in range(10)], 1000, p)["d"]
    assert many == one
    hop = graph_strengths([("d", "b", 1, 5)], 1000, p)["d"]
    assert math.isclose(hop, one * 0.5)
    # A drawer reached both ways keeps the better.
    assert graph_strengths([("d", "b", 1, 5), ("d", "a", 0, 5)], 1000, p)["d"] == one


def test_strongest_drawers_only() -> None:
    rows = [(f"d{i:03d}", f"e{i}", 0, 1 + i) for i in range(100)]
    s = graph_strengths(rows, 10_000, GraphParams(max_drawers=10))
    assert sorted(s) == [f"d{i:03d}" for i in range(10)]
    assert graph_strengths([], 10) == {}


def _cand(i: str, cos: float, graph: float = 0.0) -> Candidate:
    return Candidate(i, f"s{i}", 0, cos, {}, 10, frozenset(), False, 3.0, 0.0, graph=graph)


def test_graph_signal_is_additive_and_explained() -> None:
    cands = [_cand("a", 0.85), _cand("b", 0.85, graph=0.8)]
    off = rank(cands, [], RankParams(w_graph=0.0), 2)
    on = rank(cands, [], RankParams(w_graph=0.3), 2)
    assert [r.id for r in on] == ["b", "a"] and on[0].score > off[0].score
    assert on[0].explanation.graph > 0 and on[1].explanation.graph == 0.0
    assert all(r.explanation.graph == 0.0 for r in off)
    # The shares still add up to the score.
    e = on[0].explanation
    parts = (e.vector, e.full_text, e.speaker, e.time_window, e.neighbours, e.session, e.graph, e.importance,
             e.recency, e.diversity)
    assert math.isclose(sum(parts), on[0].score, rel_tol=1e-9)
