"""Fusion of recall signals over a few hundred candidates: pure numpy, no I/O.

The database finds candidates (nearest by embedding ∪ best full-text matches ∪ memories inside a
time window the query names) and returns a handful of numbers per candidate; this module turns them
into one score. It used to be CTEs in the search statement: the same arithmetic in numpy takes
~0.3 ms instead of ~12 ms of PostgreSQL (term unnesting, aggregates and self-joins over ~200 rows),
which is most of what recall can spend under its 25 ms budget once the query embedding took its ~15.

Signals, each chosen on ../shared/bench/locomo-dev.json with bench/ranking_lab.py (README, "Recall
quality"):

1. cosine similarity, mapped linearly from the embedding model's band (``cos_floor`` → 0,
   ``cos_ceiling`` → 1, clipped): e5-family cosines sit in a narrow band, so raw cosines would let any
   text weight swamp them; a fixed band, unlike a min-max over the candidates, means the same in every
   query and workspace;
2. Okapi BM25 of the content against the query's lexemes (``_text_signal``); document frequencies and
   the mean length are counted among the candidates (no term-statistics table to maintain), which
   measured as well as workspace-wide statistics and better than ``ts_rank_cd``, which has no notion of
   how rare a word is;
3. the drawer's speaker is named in the query ("What did Ana decide?": the answer is in what Ana
   said, not in what was said to her);
4. the drawer happened inside a time window the query names (shared/memory/timeexpr.py);
5. conversation structure: a drawer inherits ``smooth`` × the better of its neighbouring turns' scores
   (an answer sits next to its question), and ``session_boost`` × the mean of its session's three best
   scores (evidence clusters in sessions);
6. importance and recency nudge the result;
7. the knowledge graph: how strongly the entities the query names, or their neighbours one triple away,
   tie the drawer to the query (``Candidate.graph``, shared/memory/graph_signal.py), added like the
   speaker and time-window signals, so a graph-linked turn lifts its neighbours and its session too.

The fused score maps onto a 0–1 relevance (``1 - exp(-fused / relevance_scale)``) with no per-query
divisor, so a threshold means the same everywhere; each hit's ``Explanation`` gives every signal's
share of it. Session diversity is then part of the score (``_diversify``): the first five places go to
different sessions where the best twelve hold them, a drawer held back for them scores no more than the
last of those places, and a drawer below ``relevance_floor`` is never moved up. The results are in the
order of their scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Candidate", "Explanation", "RankParams", "Ranked", "bm25", "plain_fusion", "rank", "term_keys", "terms_of",
           "tsvector_terms"]


@dataclass(frozen=True)
class RankParams:
    """Fusion weights and the relevance scale; the defaults are what ships. Chosen on LoCoMo-dev and
    checked by leaving one conversation out (``bench/ranking_lab.py --held-out``; README, "Recall
    quality")."""

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
    # The vector signal maps cosine linearly from ``cos_floor`` (0) to ``cos_ceiling`` (1), clipped: a band
    # of the embedding model, the same for every query and workspace (the shipped multilingual-e5-small
    # puts nearly all query-passage cosines between them; set both for another model).
    cos_floor: float = 0.78
    cos_ceiling: float = 0.90
    # The full-text signal's scale (``_text_signal``).
    text_floor: float = 0.5
    ideal_terms: int = 2
    # relevance = 1 - exp(-fused / relevance_scale): fused scores map onto 0–1 without a per-query divisor.
    # At 1.5 a drawer whose only signal is a vector match at ``cos_ceiling`` scores 0.31, one that also
    # matches the query's words fully 0.49.
    relevance_scale: float = 1.5
    # Session diversity (``_diversify``): the first places go to different sessions, but a drawer below
    # ``relevance_floor`` is never moved up for it.
    session_cap: int = 1  # at most this many of the first ``capped_top`` from one session (0: no cap)
    capped_top: int = 5
    capped_pool: int = 12  # ...chosen among the best ``capped_pool`` only (0: among all)
    relevance_floor: float = 0.3
    superseded_factor: float = 0.5  # a drawer a newer one contradicted keeps this share of its score
    w_graph: float = 0.15  # the knowledge-graph signal (shared/memory/graph_signal.py)
    w_episode: float = 0.0  # the session's episode as a document (measured, not shipped: ranking_lab.py --enrich)


@dataclass(slots=True)
class Candidate:
    """What ranking needs of one drawer. ``content_tf`` counts the content's lexemes (stemmed; at least
    the query's), ``content_len`` all lexeme occurrences of the content, ``speaker_lexemes`` the
    speaker's (at least those the query holds). Not frozen: a search builds a couple of hundred per query,
    and a frozen dataclass sets each field through ``object.__setattr__``, several times the cost."""

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
    graph: float = 0.0  # 0–1: how strongly the knowledge graph ties it to the query (graph_signal.py)
    episode: float = 0.0  # 0–1: how well its session's episode matches the query


@dataclass(frozen=True)
class Explanation:
    """Why a drawer scored what it did: each signal's share of ``score``, on the same 0–1 scale, so the
    shares add up to the score (``diversity`` is zero or negative). The fused score is a sum of signals
    scaled by importance and recency, then mapped onto 0–1; each signal keeps its fraction of the fused
    score through that mapping. ``graph`` is the knowledge graph's share (0 when the query reached no
    drawer through it, or its weight is 0). ``cosine`` and
    ``bm25`` are the raw values behind ``vector`` and ``full_text``."""

    vector: float
    full_text: float
    speaker: float
    time_window: float
    neighbours: float
    session: float
    graph: float
    importance: float
    recency: float
    diversity: float
    cosine: float | None
    bm25: float


@dataclass(frozen=True)
class Ranked:
    id: str
    score: float  # 0–1 relevance after session diversity; results come in this order
    dense: float  # the vector signal, 0–1 on the model's cosine band
    text: float  # the full-text signal, 0–1: the share of the query's BM25 weight the drawer matches
    relevance: float  # 0–1 before session diversity
    explanation: Explanation


def tsvector_terms(text: str, lexemes: Sequence[str]) -> tuple[dict[str, int], int, frozenset[str]]:
    """What ranking needs of a drawer's ``tsv`` text, read for the query's lexemes only: their counts in
    the content, the content's length in lexeme occurrences, and which of them the speaker holds.

    PostgreSQL prints weight D (the speaker, migration 0001) without a letter, so a position without
    "A" is the speaker's. Reading only the query's lexemes with ``str.find`` costs a quarter of parsing
    the whole vector with a regex (0.44 vs 1.58 ms for 200 candidates; the test checks both agree).
    The length counts weight letters: every content position prints as ``nA``, and to_tsvector
    lower-cases every lexeme, so no "A" comes from a lexeme itself.
    """
    return terms_of(text, term_keys(lexemes))


def term_keys(lexemes: Sequence[str]) -> list[tuple[str, str]]:
    """Each query lexeme with the text that opens its entry in a printed ``tsv`` (``terms_of``): built once
    per query rather than once per candidate and lexeme."""
    return [(lex, "'" + lex.replace("'", "''") + "':") for lex in lexemes]


def terms_of(text: str, keys: Sequence[tuple[str, str]]) -> tuple[dict[str, int], int, frozenset[str]]:
    """``tsvector_terms`` with the keys of ``term_keys``."""
    content: dict[str, int] = {}
    speaker: set[str] = set()
    for lex, key in keys:
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


def bm25(cands: Sequence[Candidate], lexemes: Sequence[str], k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 of each candidate's content, with document frequencies and mean length counted among
    the candidates."""
    return _bm25_idf(cands, lexemes, k1, b)[0]


def _bm25_idf(cands: Sequence[Candidate], lexemes: Sequence[str], k1: float, b: float,
              dl: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BM25 per candidate and the idf of each distinct query lexeme (``dl``: the content lengths, when
    the caller has them already)."""
    if dl is None:
        dl = np.fromiter((c.content_len for c in cands), dtype=float, count=len(cands))
    counted = dl > 0
    n = int(counted.sum())
    if not n or not lexemes:
        return np.zeros(len(cands)), np.zeros(0)
    norm = k1 * (1 - b + b * dl / dl[counted].mean())
    terms = {t: j for j, t in enumerate(dict.fromkeys(lexemes))}
    tf = np.zeros((len(cands), len(terms)))
    rows, cols, counts = [], [], []
    for i, c in enumerate(cands):
        for t, count in c.content_tf.items():  # a few of a drawer's lexemes are the query's
            j = terms.get(t)
            if j is not None:
                rows.append(i)
                cols.append(j)
                counts.append(count)
    tf[rows, cols] = counts
    df = np.count_nonzero(tf, axis=0)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    return (idf * tf * (k1 + 1) / (tf + norm[:, None])).sum(axis=1), idf


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


def _text_signal(cands: Sequence[Candidate], lexemes: Sequence[str], p: RankParams,
                 dl: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Raw BM25 and the full-text signal on 0–1: BM25 over the larger of the best BM25 among the
    candidates and ``text_floor`` × an ideal match (what a drawer of average length holding the query's
    ``ideal_terms`` rarest lexemes once each scores: the sum of their idf). A strong best match sets the
    scale, as plain BM25-over-the-best does; a weak one stays weak instead of counting as a full match,
    so the signal means the same in a workspace where nothing matches well."""
    raw, idf = _bm25_idf(cands, lexemes, p.bm25_k1, p.bm25_b, dl)
    if not raw.any():
        return raw, np.zeros(len(cands))
    ideal = float(np.sort(idf)[::-1][: p.ideal_terms].sum())
    return raw, np.minimum(raw / max(float(raw.max()), p.text_floor * ideal), 1.0)


def _diversify(cands: Sequence[Candidate], rel: np.ndarray, p: RankParams) -> tuple[np.ndarray, list[int]]:
    """Relevance after session diversity, as a score, so the order of results stays the order of scores.

    Among the best ``capped_pool`` by relevance, the first ``capped_top`` places go to at most
    ``session_cap`` drawers of one session, best first; a drawer is moved up into them only if its
    relevance is at least ``relevance_floor``. A drawer held back for them scores the lesser of its own
    relevance and the last of those places' (so it follows right after them, in its order, still above
    everything outside the pool); all others keep their relevance. Returns the scores and the order
    (scores never increase along it; of equal scores, the one that was not held back comes first)."""
    out = rel.copy()
    r = rel.tolist()  # Python floats: indexing an array per comparison key costs more than the sort
    order = sorted(range(len(cands)), key=lambda i: (-r[i], cands[i].id))
    if not p.session_cap or not p.capped_top:
        return out, order
    pool = order[: p.capped_pool] if p.capped_pool else order
    head: list[int] = []
    held: list[int] = []
    per: dict[str, int] = {}
    for i in pool:
        if len(head) >= p.capped_top:
            held.append(i)
            continue
        sid = cands[i].session_id
        fits = sid is None or per.get(sid, 0) < p.session_cap
        promoted = bool(held)  # something better is being held back for it
        if fits and (not promoted or rel[i] >= p.relevance_floor):
            head.append(i)
            if sid is not None:
                per[sid] = per.get(sid, 0) + 1
        elif fits:  # below the floor: no promotion, and nothing after it could be promoted either
            held.append(i)
            break
        else:
            held.append(i)
    if held and head:
        last = rel[head[-1]]
        for i in held:
            out[i] = min(rel[i], last)
    placed = set(head) | set(held)
    return out, head + held + [i for i in order if i not in placed]


def rank(cands: Sequence[Candidate], query_lexemes: Sequence[str], p: RankParams, k: int) -> list[Ranked]:
    """The best ``k`` candidates by 0–1 relevance after session diversity, best first (ties broken by id,
    so a ranking is reproducible)."""
    if not cands:
        return []
    n = len(cands)
    qset = frozenset(query_lexemes)
    # Every per-candidate number in one pass (one array), not one generator per signal.
    cols = np.array([(np.nan if c.cos is None else c.cos, c.content_len, not qset.isdisjoint(c.speaker_lexemes),
                      c.dated, c.graph, c.episode, c.importance, c.age_days) for c in cands], dtype=float)
    cos, dl, named, dated, graph, episode, imp, age = cols.T
    band = max(p.cos_ceiling - p.cos_floor, 1e-9)
    dense = np.clip((np.nan_to_num(cos, nan=p.cos_floor) - p.cos_floor) / band, 0.0, 1.0)
    raw_text, text = _text_signal(cands, query_lexemes, p, dl)
    parts = {"vector": p.w_dense * dense, "full_text": p.w_text * text, "speaker": p.w_speaker * named,
             "time_window": p.w_date * dated, "graph": p.w_graph * graph}
    s = sum(parts.values())
    parts["neighbours"] = p.smooth * _neighbour_best(cands, s)
    sm = s + parts["neighbours"]
    parts["session"] = p.session_boost * _session_strength(cands, sm, p.session_top) + p.w_episode * episode
    base = sm + parts["session"]
    age = np.maximum(age, 0.0)
    imp_f = 1 + p.w_importance * (imp - 3)
    rec_f = 1 + p.w_recency / (1 + age / p.recency_days)
    parts["importance"] = base * (imp_f - 1)
    parts["recency"] = base * imp_f * (rec_f - 1)
    fused = base * imp_f * rec_f
    rel = 1 - np.exp(-np.maximum(fused, 0.0) / p.relevance_scale)
    # What a newer drawer contradicted keeps a share of its relevance and never outranks its successor.
    rel = _below_successors(cands, rel, p.superseded_factor)
    final, order = _diversify(cands, rel, p)
    # Diversity may have held a successor back below what it contradicted: the rule holds on the scores too.
    final, order = _after_successors(cands, final, order)
    share = np.divide(rel, fused, out=np.zeros(n), where=fused > 0)
    out = []
    for i in order[:k]:
        e = Explanation(**{name: float(v[i] * share[i]) for name, v in parts.items()},
                        diversity=float(final[i] - rel[i]), cosine=None if np.isnan(cos[i]) else float(cos[i]),
                        bm25=float(raw_text[i]))
        out.append(Ranked(cands[i].id, float(final[i]), float(dense[i]), float(text[i]), float(rel[i]), e))
    return out


def _below_successors(cands: Sequence[Candidate], final: np.ndarray, factor: float) -> np.ndarray:
    """A superseded drawer keeps ``factor`` of its score, and, when its successor is a candidate too,
    scores just below it (or as low, at 0): what a newer drawer contradicted never outranks the newer
    drawer (``_after_successors`` puts it after it)."""
    sup = _successor_pairs(cands)
    if not sup:
        return final
    final = final.copy()
    for i, _ in sup:
        final[i] *= factor
    return _cap_at_successors(final, [(i, j) for i, j in sup if j is not None])


def _successor_pairs(cands: Sequence[Candidate]) -> list[tuple[int, int | None]]:
    """(superseded drawer, its successor's index among the candidates or None), per superseded drawer."""
    idx = {c.id: i for i, c in enumerate(cands)}
    return [(i, idx.get(c.superseded_by)) for i, c in enumerate(cands) if c.superseded_by]


def _cap_at_successors(final: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """Each superseded drawer's score just under its successor's (equal at 0: scores stay on 0–1);
    chains (a superseded by b superseded by c) settle in as many passes."""
    for _ in range(len(pairs)):
        changed = False
        for i, j in pairs:
            if final[i] >= final[j] and (final[j] > 0 or final[i] > 0):
                final[i] = np.nextafter(final[j], -np.inf) if final[j] > 0 else 0.0
                changed = True
        if not changed:
            break
    return final


def _after_successors(cands: Sequence[Candidate], final: np.ndarray,
                      order: list[int]) -> tuple[np.ndarray, list[int]]:
    """Scores and order with every superseded drawer below, and after, its successor among them."""
    pairs = [(i, j) for i, j in _successor_pairs(cands) if j is not None]
    if not pairs:
        return final, order
    final = _cap_at_successors(final.copy(), pairs)
    pos = {i: float(n) for n, i in enumerate(order)}
    for _ in range(len(pairs)):  # a tie (both at 0) keeps the successor first
        changed = False
        for i, j in pairs:
            if final[i] == final[j] and pos[i] < pos[j]:
                pos[i] = pos[j] + 0.5
                changed = True
        if not changed:
            break
    return final, sorted(order, key=lambda i: (-final[i], pos[i]))


def plain_fusion(cands: Sequence[Candidate], query_lexemes: Sequence[str], k: int, w_dense: float = 0.7,
                 w_text: float = 0.3) -> list[str]:
    """The textbook hybrid the seeds start from, kept as a benchmark baseline: ``w_dense`` × raw cosine +
    ``w_text`` × BM25 / best BM25, nothing else. Ids, best first."""
    cos = np.fromiter((0.0 if c.cos is None else c.cos for c in cands), dtype=float, count=len(cands))
    s = w_dense * cos + w_text * _by_max(bm25(cands, query_lexemes))
    return [cands[i].id for i in _best(cands, s, k)]
