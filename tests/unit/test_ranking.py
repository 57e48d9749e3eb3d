"""Fusion of recall signals (shared/memory/ranking.py) on hand-made candidates with known answers."""

import re
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.memory.ranking import Candidate, Ranked, RankParams, rank, tsvector_terms


def parse_tsvector(text: str) -> tuple[dict[str, int], frozenset[str]]:
    """The whole vector, by a regex: the reference ``tsvector_terms`` must agree with."""
    content: dict[str, int] = {}
    speaker: set[str] = set()
    for lexeme, positions in re.findall(r"'([^']*(?:''[^']*)*)':(\S+)", text):
        lexeme = lexeme.replace("''", "'")
        if a := positions.count("A"):
            content[lexeme] = a
        if a <= positions.count(","):
            speaker.add(lexeme)
    return content, frozenset(speaker)


def cand(id: str, *, cos: float | None = 0.5, words: str = "", session: str | None = "s1", seq: int | None = None,
         speaker: str = "", dated: bool = False, importance: float = 3.0, age_days: float = 0.0) -> Candidate:
    tf: dict[str, int] = {}
    for w in words.split():
        tf[w] = tf.get(w, 0) + 1
    return Candidate(id, session, seq, cos, tf, sum(tf.values()), frozenset(speaker.split()), dated, importance,
                     age_days)


# Synthetic cosines span 0..1 here, so the vector band is the whole range; without the session cap
# (its own tests below) the order is the relevance's.
BAND = RankParams(cos_floor=0.0, cos_ceiling=1.0)
SCORE_ORDER = replace(BAND, session_cap=0)


def ids(cands: list[Candidate], lexemes: list[str], p: RankParams = SCORE_ORDER, k: int = 10) -> list[str]:
    return [r.id for r in rank(cands, lexemes, p, k)]


def test_parse_tsvector_splits_content_counts_from_speaker_lexemes() -> None:
    content, speaker = parse_tsvector("'amaz':23A,27A 'carolin':43 'jon':3A,15 'it''s':4A")
    assert content == {"amaz": 2, "jon": 1, "it's": 1}
    assert speaker == {"carolin", "jon"}
    assert parse_tsvector("") == ({}, frozenset())


def test_no_candidates_rank_to_nothing() -> None:
    assert rank([], ["x"], RankParams(), 5) == []


def test_dense_similarity_orders_when_nothing_else_differs() -> None:
    cs = [cand("a", cos=0.2, session="1"), cand("b", cos=0.9, session="2"), cand("c", cos=0.5, session="3")]
    assert ids(cs, []) == ["b", "c", "a"]


def test_bm25_prefers_the_rare_query_word() -> None:
    # every candidate says "trip"; only one says "lisbon": that one wins at equal cosine
    cs = [cand(f"d{i}", words="trip " + ("lisbon" if i == 3 else "home"), session=str(i)) for i in range(6)]
    assert ids(cs, ["trip", "lisbon"])[0] == "d3"


def test_without_an_embedding_full_text_still_ranks() -> None:
    cs = [cand("a", cos=None, words="garden", session="1"), cand("b", cos=None, words="pottery class", session="2")]
    top = rank(cs, ["potteri", "pottery", "class"], BAND, 2)
    assert top[0].id == "b" and top[0].dense == 0.0 and top[0].text > 0.9 and top[1].text == 0.0


def test_a_named_speaker_and_a_named_time_raise_their_drawers() -> None:
    cs = [cand("a", cos=0.6, session="1"), cand("b", cos=0.58, session="2", speaker="melani"),
          cand("c", cos=0.59, session="3", dated=True), cand("floor", cos=0.1, session="4")]
    assert ids(cs, ["melani"], replace(BAND, w_date=0.0))[0] == "b"
    assert ids(cs, ["hike"], replace(BAND, w_speaker=0.0))[0] == "c"
    assert ids(cs, ["hike"], replace(BAND, w_speaker=0.0, w_date=0.0))[0] == "a"


def test_the_turn_after_a_strong_match_outranks_an_isolated_equal_turn() -> None:
    cs = [cand("q", cos=0.9, session="1", seq=1), cand("answer", cos=0.5, session="1", seq=2),
          cand("lonely", cos=0.5, session="2", seq=7), cand("floor", cos=0.1, session="3", seq=1)]
    order = ids(cs, [], replace(SCORE_ORDER, session_boost=0.0))
    assert order.index("answer") < order.index("lonely")


def test_session_strength_lifts_turns_of_a_session_full_of_matches() -> None:
    strong = [cand(f"s{i}", cos=0.8, session="hot", seq=i * 10) for i in range(3)]
    cs = [*strong, cand("x", cos=0.55, session="hot", seq=99), cand("y", cos=0.6, session="cold", seq=0),
          cand("floor", cos=0.1, session="none", seq=0)]
    assert ids(cs, []).index("x") < ids(cs, []).index("y")
    assert ids(cs, [], replace(SCORE_ORDER, session_boost=0.0)).index("y") < \
        ids(cs, [], replace(SCORE_ORDER, session_boost=0.0)).index("x")


def test_importance_and_recency_nudge_and_ties_break_by_id() -> None:
    floor = cand("floor", cos=0.1, session=None)
    cs = [cand("b", session=None), cand("a", session=None), floor]
    assert ids(cs, []) == ["a", "b", "floor"]  # equal scores: by id, reproducibly
    cs = [cand("b", session=None, importance=5.0), cand("a", session=None), floor]
    assert ids(cs, []) == ["b", "a", "floor"]
    cs = [cand("b", session=None, age_days=0.0), cand("a", session=None, age_days=400.0), floor]
    assert ids(cs, []) == ["b", "a", "floor"]
    assert ids(cs, [], k=1) == ["b"]


def test_tsvector_terms_is_parse_tsvector_restricted_to_the_query() -> None:
    tsv = "'amaz':23A,27A 'art':5A 'carolin':43 'jon':3A,15 'sm''art':9A 'it''s':4A,6A 'x':1"
    content, speaker = parse_tsvector(tsv)
    for lexemes in (["amaz", "jon"], ["art"], ["carolin", "missing"], ["it's", "sm'art"], [], ["x"]):
        tf, length, spk = tsvector_terms(tsv, lexemes)
        assert tf == {t: n for t, n in content.items() if t in lexemes}
        assert spk == {t for t in speaker if t in lexemes}
        assert length == sum(content.values())
    assert tsvector_terms("", ["a"]) == ({}, 0, frozenset())
    # "'art':" also occurs inside "'sm''art':" — only the lexeme of its own counts
    assert tsvector_terms("'sm''art':9A", ["art"]) == ({}, 1, frozenset())


def test_session_cap_spreads_the_top_places_over_sessions_and_keeps_the_rest_close() -> None:
    cs = [cand(f"a{i}", cos=0.9 - i * 0.01, session="A", seq=i * 10) for i in range(4)]
    cs += [cand("b0", cos=0.7, session="B", seq=0), cand("c0", cos=0.6, session="C", seq=0)]
    flat = replace(BAND, session_boost=0.0, smooth=0.0, relevance_floor=0.0)  # the floor has its own test
    plain = ids(cs, [], replace(flat, session_cap=0))
    assert plain == ["a0", "a1", "a2", "a3", "b0", "c0"]
    capped = ids(cs, [], replace(flat, session_cap=2, capped_top=4))
    # two of A in the top 4, then B and C; the A drawers held back follow at once, in their order
    assert capped == ["a0", "a1", "b0", "c0", "a2", "a3"]
    assert ids(cs, [], replace(flat, session_cap=2, capped_top=4), k=3) == ["a0", "a1", "b0"]
    # fewer sessions than places: nothing is lost, the held-back drawers fill in
    assert ids(cs[:4], [], replace(flat, session_cap=1, capped_top=3)) == ["a0", "a1", "a2", "a3"]


def check_scores(ranked: list[Ranked]) -> None:
    """What every ranking must hold: 0–1 scores, in order, and explanations that add up to them."""
    scores = [r.score for r in ranked]
    assert all(0.0 <= x <= 1.0 for x in scores)
    assert scores == sorted(scores, reverse=True)
    for r in ranked:
        e = r.explanation
        total = (e.vector + e.full_text + e.speaker + e.time_window + e.neighbours + e.session + e.graph
                 + e.importance + e.recency + e.diversity)
        assert abs(total - r.score) < 1e-9, (r.id, total, r.score)
        assert e.graph == 0.0 and e.diversity <= 0.0
        assert r.score <= r.relevance + 1e-12


def test_session_diversity_never_promotes_a_drawer_below_the_relevance_floor() -> None:
    # The demo's bug: a barely related drawer of another session taking second place.
    strong = [cand(f"a{i}", cos=0.95 - i * 0.01, words="billing postgres", session="A", seq=i) for i in range(3)]
    weak = cand("z", cos=0.05, session="Z", seq=0)
    ranked = rank([*strong, weak], ["billing", "postgr"], BAND, 4)
    check_scores(ranked)
    assert [r.id for r in ranked] == ["a0", "a1", "a2", "z"]
    assert ranked[-1].relevance < BAND.relevance_floor <= ranked[1].score
    # A relevant drawer of another session does take a first place, and scores what the place is worth.
    other = cand("b0", cos=0.8, words="billing", session="B", seq=0)
    ranked = rank([*strong, weak, other], ["billing", "postgr"], BAND, 5)
    check_scores(ranked)
    assert [r.id for r in ranked][:2] == ["a0", "b0"] and ranked[-1].id == "z"
    held = next(r for r in ranked if r.id == "a1")
    assert held.explanation.diversity < 0 and held.score == ranked[1].score


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 1.0) | st.none(), st.sampled_from(["x", "y", "z", "x y", ""]),
                          st.sampled_from(["s1", "s2", "s3", None]), st.integers(0, 6), st.booleans(),
                          st.floats(0, 5), st.floats(0, 1000), st.none() | st.integers(0, 29)), max_size=30),
       st.integers(1, 30))
def test_any_ranking_is_in_score_order_on_0_1_with_explanations_that_add_up(rows: list, k: int) -> None:
    cs = [replace(cand(f"d{i:02d}", cos=c, words=w, session=s, seq=q, dated=d, importance=imp, age_days=age),
                  superseded_by=f"d{sup:02d}" if sup is not None and sup != i else None)
          for i, (c, w, s, q, d, imp, age, sup) in enumerate(rows)]
    for p in (RankParams(), BAND, SCORE_ORDER):
        ranked = rank(cs, ["x", "y"], p, k)
        assert len(ranked) == min(k, len(cs)) and len({r.id for r in ranked}) == len(ranked)
        check_scores(ranked)
        # what a newer drawer contradicted comes after it, diversity or not (a cycle has no newer drawer)
        place = {r.id: n for n, r in enumerate(rank(cs, ["x", "y"], p, len(cs)))}
        by_id = {c.id: c for c in cs}
        for c in cs:
            succ = by_id.get(c.superseded_by or "")
            if succ is not None and by_id.get(succ.superseded_by or "") is not c and not _in_cycle(by_id, c):
                assert place[c.id] > place[succ.id], (c.id, succ.id)
        floor = p.relevance_floor
        # diversity never lets a drawer below the floor overtake one at or above it
        for i, r in enumerate(ranked):
            if r.relevance < floor:
                assert all(x.relevance < floor or x.score >= r.score for x in ranked[i:])


def _in_cycle(by_id: dict[str, Candidate], c: Candidate) -> bool:
    seen, x = set(), c
    while x is not None and x.id not in seen:
        seen.add(x.id)
        x = by_id.get(x.superseded_by or "")
    return x is not None


def test_a_successor_held_back_for_diversity_still_outranks_what_it_contradicted() -> None:
    """The newer drawer shares its session with a better one, so diversity holds it back; the older drawer it
    contradicted, alone in its session, would have been moved up past it."""
    q = ["orion"]

    def c(i: str, session: str, cos: float, tf: int = 0, sup: str | None = None) -> Candidate:
        return Candidate(i, session, 0, cos, {"orion": tf} if tf else {}, 10, frozenset(q), False, 3.0, 0.0, sup)

    cands = [c("h", "S1", 0.90, 2), c("j", "S1", 0.88, 1), c("i", "S2", 0.90, 2, sup="j"),
             c("k", "S3", 0.86), c("m", "S4", 0.85), c("n", "S5", 0.70)]
    ranked = rank(cands, q, RankParams(), 10)
    order = [r.id for r in ranked]
    assert order.index("j") < order.index("i")
    check_scores(ranked)


def test_a_superseded_drawer_with_no_signal_stays_at_zero_after_its_successor() -> None:
    cands = [cand("a", cos=0.1, session="s1", seq=1), cand("b", cos=0.1, session="s2", seq=1)]
    cands[0] = replace(cands[0], superseded_by="b")
    ranked = rank(cands, ["x"], RankParams(), 2)
    assert [r.id for r in ranked] == ["b", "a"] and all(r.score == 0.0 for r in ranked)
    check_scores(ranked)


def test_relevance_is_absolute_not_relative_to_the_best_hit() -> None:
    weak = [cand("w1", cos=0.79, session="1"), cand("w2", cos=0.785, session="2")]
    strong = [cand("s1", cos=0.92, words="marathon berlin", session="1"),
              cand("s2", cos=0.85, words="marathon", session="2")]
    top_weak = rank(weak, ["marathon", "berlin"], RankParams(), 2)[0]
    top_strong = rank(strong, ["marathon", "berlin"], RankParams(), 2)[0]
    assert top_weak.score < 0.1 < 0.3 < top_strong.score
