"""Fusion of recall signals over a few hundred candidates: pure numpy, no I/O.

The database finds candidates (nearest by embedding ∪ best full-text matches ∪ memories inside a
time window the query names) and returns a handful of numbers per candidate; this module turns them
into one score. It used to be CTEs in the search statement: the same arithmetic in numpy takes
~0.3 ms instead of ~12 ms of PostgreSQL (term unnesting, aggregates and self-joins over ~200 rows),
which is most of what recall can spend under its 25 ms budget once the query embedding took its ~15.

Signals, each chosen on ../shared/bench/locomo-dev.json with bench/ranking_lab.py (README, "Recall
quality"):

1. cosine similarity, min-max normalised over the candidates (e5-family cosines sit in a narrow band,
   so raw cosines let any text weight swamp them);
2. Okapi BM25 of the content against the query's lexemes, divided by the best among the candidates;
   document frequencies and the mean length are counted among the candidates (no term-statistics
   table to maintain), which measured as well as workspace-wide statistics and better than
   ``ts_rank_cd``, which has no notion of how rare a word is;
3. the drawer's speaker is named in the query ("What did Ana decide?": the answer is in what Ana
   said, not in what was said to her);
4. the drawer happened inside a time window the query names (shared/memory/timeexpr.py);
5. conversation structure: a drawer inherits ``smooth`` × the better of its neighbouring turns' scores
   (an answer sits next to its question), and ``session_boost`` × the mean of its session's three best
   scores (evidence clusters in sessions);
6. importance and recency nudge the result;
7. the first five places go to five different sessions where the best ten hold them: the best drawer
   of each session first, the others right after. The best ten stay the same ten (turn R@10 cannot
   change); a reader of the first five sees more of the past. On LoCoMo-dev session recall_any@5 went
   0.936 → 0.955 and turn R@5 0.732 → 0.659 (a question's second evidence turn in the same session
   now sits at 6–10 more often).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Candidate", "RankParams", "Ranked", "bm25", "plain_fusion", "rank", "tsvector_terms"]


@dataclass(frozen=True)
class RankParams:
    """Fusion weights; the defaults are what ships. Chosen on LoCoMo-dev and checked by leaving one
    conversation out (``bench/ranking_lab.py --held-out``): weights picked without a conversation score
    it as well as these do (README, "Recall quality")."""

    w_dense: float = 0.55
    w_text: float = 0.45
    w_speaker: float = 0.5
    w_date: float = 0.3
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    smooth: float = 0.3
    session_boost: float = 0.3
    session_top: int = 3
    w_importance: float = 0.02
    recency_days: float = 30.0
    w_recency: float = 0.05
    session_cap: int = 1  # at most this many of the first ``capped_top`` from one session (0: no cap)
    capped_top: int = 5
    capped_pool: int = 10  # ...chosen among the best ``capped_pool`` only (0: among all)
    superseded_factor: float = 0.5  # a drawer a newer one contradicted keeps this share of its score


@dataclass(frozen=True)
class Candidate:
    """What ranking needs of one drawer. ``content_tf`` counts the content's lexemes (stemmed; at least
    the query's), ``content_len`` all lexeme occurrences of the content, ``speaker_lexemes`` the
    speaker's (at least those the query holds)."""

    id: str
    session_id: str | None
    seq: int | None
    cos: float | None
    content_tf: dict[str, int]
    content_len: int
    speaker_lexemes: frozenset[str]
    dated: bool
    importance: float
    age_days: float
    superseded_by: str | None = None  # the newer drawer that contradicted this one


@dataclass(frozen=True)
class Ranked:
    id: str
    score: float
    dense: float
    text: float


def tsvector_terms(text: str, lexemes: Sequence[str]) -> tuple[dict[str, int], int, frozenset[str]]:
    """What ranking needs of a drawer's ``tsv`` text, read for the query's lexemes only: their counts in
    the content, the content's length in lexeme occurrences, and which of them the speaker holds.

    PostgreSQL prints weight D (the speaker, migration 0001) without a letter, so a position without
    "A" is the speaker's. Reading only the query's lexemes with ``str.find`` costs a quarter of parsing
    the whole vector with a regex (0.44 vs 1.58 ms for 200 candidates; the test checks both agree).
    The length counts weight letters: every content position prints as ``nA``, and to_tsvector
    lower-cases every lexeme, so no "A" comes from a lexeme itself.
    """
    content: dict[str, int] = {}
    speaker: set[str] = set()
    for lex in lexemes:
        key = "'" + lex.replace("'", "''") + "':"
        at = text.find(key)
        while at > 0 and text[at - 1] != " ":  # inside another lexeme ("'sm''art':" holds "'art':")
            at = text.find(key, at + 1)
        if at < 0:
            continue
        start = at + len(key)
        end = text.find(" ", start)
        positions = text[start:] if end < 0 else text[start:end]
        a = positions.count("A")
        if a:
            content[lex] = a
        if a <= positions.count(","):
            speaker.add(lex)
    return content, text.count("A"), frozenset(speaker)


def _by_max(v: np.ndarray) -> np.ndarray:
    return v / v.max() if len(v) and v.max() > 0 else v


def _best(cands: Sequence[Candidate], scores: np.ndarray, k: int) -> list[int]:
    """Indexes of the ``k`` best, ties broken by id so a ranking is reproducible."""
    return sorted(range(len(cands)), key=lambda i: (-scores[i], cands[i].id))[:k]


def _minmax(v: np.ndarray, valid: np.ndarray) -> np.ndarray:
    if not valid.any():
        return np.zeros_like(v)
    lo, hi = v[valid].min(), v[valid].max()
    return np.where(valid, (v - lo) / (hi - lo), 0.0) if hi > lo else np.zeros_like(v)


def bm25(cands: Sequence[Candidate], lexemes: Sequence[str], k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 of each candidate's content, with document frequencies and mean length counted among
    the candidates."""
    dl = np.fromiter((c.content_len for c in cands), dtype=float, count=len(cands))
    counted = dl > 0
    n = int(counted.sum())
    if not n or not lexemes:
        return np.zeros(len(cands))
    norm = k1 * (1 - b + b * dl / dl[counted].mean())
    terms = {t: j for j, t in enumerate(dict.fromkeys(lexemes))}
    tf = np.zeros((len(cands), len(terms)))
    for i, c in enumerate(cands):
        for t in terms.keys() & c.content_tf.keys():  # a few of a drawer's lexemes are the query's
            tf[i, terms[t]] = c.content_tf[t]
    df = np.count_nonzero(tf, axis=0)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    return (idf * tf * (k1 + 1) / (tf + norm[:, None])).sum(axis=1)


def _neighbour_best(cands: Sequence[Candidate], s: np.ndarray) -> np.ndarray:
    """Per candidate, the better score of the turns just before and after it in its session (0: none)."""
    pos = {(c.session_id, c.seq): i for i, c in enumerate(cands) if c.session_id is not None and c.seq is not None}
    padded = np.append(s, 0.0)  # index -1 → 0
    miss = len(cands)
    prev = np.fromiter((pos.get((c.session_id, c.seq - 1), miss) if c.seq is not None else miss for c in cands),
                       dtype=np.intp, count=len(cands))
    nxt = np.fromiter((pos.get((c.session_id, c.seq + 1), miss) if c.seq is not None else miss for c in cands),
                      dtype=np.intp, count=len(cands))
    return np.maximum(padded[prev], padded[nxt])


def _session_strength(cands: Sequence[Candidate], sm: np.ndarray, top: int) -> np.ndarray:
    """Per candidate, the mean of its session's ``top`` best scores (0 outside any session)."""
    codes: dict[str, int] = {}
    sess = np.fromiter((codes.setdefault(c.session_id, len(codes)) if c.session_id is not None else -1
                        for c in cands), dtype=np.intp, count=len(cands))
    if not codes:
        return np.zeros(len(cands))
    order = np.lexsort((-sm, sess))  # by session, best first
    ranked_sess = sess[order]
    first = np.searchsorted(ranked_sess, ranked_sess)  # where each row's session starts
    keep = (np.arange(len(order)) - first < top) & (ranked_sess >= 0)
    sums = np.bincount(ranked_sess[keep], weights=sm[order][keep], minlength=len(codes))
    counts = np.bincount(ranked_sess[keep], minlength=len(codes))
    mean = sums / np.maximum(counts, 1)
    return np.where(sess >= 0, mean[np.maximum(sess, 0)], 0.0)


def rank(cands: Sequence[Candidate], query_lexemes: Sequence[str], p: RankParams, k: int) -> list[Ranked]:
    """The best ``k`` candidates, best first (ties broken by id, so a ranking is reproducible)."""
    if not cands:
        return []
    n = len(cands)
    cos = np.fromiter((np.nan if c.cos is None else c.cos for c in cands), dtype=float, count=n)
    dense = _minmax(np.nan_to_num(cos), ~np.isnan(cos))
    text = _by_max(bm25(cands, query_lexemes, p.bm25_k1, p.bm25_b))
    qset = frozenset(query_lexemes)
    named = np.fromiter((not qset.isdisjoint(c.speaker_lexemes) for c in cands), dtype=float, count=n)
    dated = np.fromiter((c.dated for c in cands), dtype=float, count=n)
    s = p.w_dense * dense + p.w_text * text + p.w_speaker * named + p.w_date * dated
    sm = s + p.smooth * _neighbour_best(cands, s)
    sess = _session_strength(cands, sm, p.session_top)
    imp = np.fromiter((c.importance for c in cands), dtype=float, count=n)
    age = np.fromiter((max(c.age_days, 0.0) for c in cands), dtype=float, count=n)
    final = (sm + p.session_boost * sess) * (1 + p.w_importance * (imp - 3)) \
        * (1 + p.w_recency / (1 + age / p.recency_days))
    final = _below_successors(cands, final, p.superseded_factor)
    order = _best(cands, final, n if p.session_cap else k)
    if p.session_cap:
        order = _cap_sessions(cands, order, p.session_cap, p.capped_top, p.capped_pool)[:k]
    return [Ranked(cands[i].id, float(final[i]), float(dense[i]), float(text[i])) for i in order]


def _below_successors(cands: Sequence[Candidate], final: np.ndarray, factor: float) -> np.ndarray:
    """A superseded drawer keeps ``factor`` of its score, and, when its successor is a candidate too,
    scores just below it: what a newer drawer contradicted never outranks the newer drawer."""
    idx = {c.id: i for i, c in enumerate(cands)}
    sup = [(i, idx.get(c.superseded_by)) for i, c in enumerate(cands) if c.superseded_by]
    if not sup:
        return final
    final = final.copy()
    for i, _ in sup:
        final[i] *= factor
    for _ in range(len(sup)):  # chains (a superseded by b superseded by c) settle in as many passes
        changed = False
        for i, j in sup:
            if j is not None and final[i] >= final[j]:
                final[i] = np.nextafter(final[j], -np.inf) if final[j] > 0 else final[j] - 1e-9
                changed = True
        if not changed:
            break
    return final


def _cap_sessions(cands: Sequence[Candidate], order: list[int], cap: int, top: int, pool: int) -> list[int]:
    """The first ``top`` places hold at most ``cap`` drawers of one session, taken among the best ``pool``
    (0: all); the ones held back follow right after, in their order, so they stay near the top."""
    window = order[:pool] if pool else order
    head: list[int] = []
    held: list[int] = []
    per: dict[str | None, int] = {}
    for i in window:
        sid = cands[i].session_id
        if len(head) < top and (sid is None or per.get(sid, 0) < cap):
            head.append(i)
            per[sid] = per.get(sid, 0) + 1
        else:
            held.append(i)
    return head + held + order[len(window):]


def plain_fusion(cands: Sequence[Candidate], query_lexemes: Sequence[str], k: int, w_dense: float = 0.7,
                 w_text: float = 0.3) -> list[str]:
    """The textbook hybrid the seeds start from, kept as a benchmark baseline: ``w_dense`` × raw cosine +
    ``w_text`` × BM25 / best BM25, nothing else. Ids, best first."""
    cos = np.fromiter((0.0 if c.cos is None else c.cos for c in cands), dtype=float, count=len(cands))
    s = w_dense * cos + w_text * _by_max(bm25(cands, query_lexemes))
    return [cands[i].id for i in _best(cands, s, k)]
