"""Ranking lab: evaluate fusion variants on LoCoMo-dev in seconds, from features read once.

Run ``palace bench locomo`` first (it ingests the dev conversations through the pipeline), then
``palace stack start`` so this can read the database. It reads every drawer (embedding, text, lexemes
with their counts, session, position, time) and, per question, its lexemes and ``ts_rank_cd``;
everything is cached under bench/results/.cache, so later runs need neither the database nor the model.

The ``product`` rows run shared/memory/ranking.py itself over the candidates shared/db/search.py picks
(``product_candidates``), so they reproduce ``palace bench locomo`` and a variant is always compared
with what ships, in the same run. The ``sql fusion`` rows are the numpy re-implementation of the single
SQL statement that shipped before the fusion moved to numpy (``scored``), kept for the README's step
table.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from palace_dev.evaluation.locomo import load_locomo
from palace_dev.evaluation.metrics import QuestionResult, flatten_units, summarize
from shared.config import Settings
from shared.memory.graph_signal import GraphParams, graph_strengths, query_names
from shared.memory.ranking import Candidate, RankParams, rank
from shared.memory.timeexpr import date_windows

CACHE = Path("bench/results/.cache")


@dataclass
class Conv:
    sample_id: str
    ids: list[str]
    emb: np.ndarray
    dia: list[list[str]]
    session: np.ndarray  # session ordinal per drawer
    seq: np.ndarray  # position within its session (as drawers.seq)
    importance: np.ndarray
    content: list[str]
    speaker: list[str]
    context: list[str]
    occurred: list[str]
    lex: list[dict[str, int]]  # lexeme → count (content, weight A)
    questions: list  # (question, evidence, category)
    qvec: np.ndarray
    qlex: list[list[str]]
    text_rank: list[np.ndarray]  # per question: product ts_rank_cd per drawer (0 if no match)
    extra: dict[str, object] = field(default_factory=dict)


def load(settings: Settings, data: Path) -> list[Conv]:
    """Features of every dev conversation, from the cache or the running stack."""
    ident = f"{data.resolve()}|{settings.embed_model}|{settings.embed_runtime}|v2"
    key = hashlib.sha256(ident.encode()).hexdigest()[:10]
    path = CACHE / f"lab-{key}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    import psycopg
    from pgvector.psycopg import register_vector

    from palace_dev.benchmarks.locomo import _workspace
    from shared.adapters import build_embedder

    db_url = json.loads((settings.devstack_dir / "stack.json").read_text())["database_url"]
    emb = build_embedder(settings)
    out = []
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        for c in load_locomo(data):
            ws = _workspace(c.sample_id, settings, data)
            rows = conn.execute(
                """SELECT d.id, d.embedding, array_agg(m.metadata->>'dia_id' ORDER BY ds.session_id, ds.seq),
                          d.seq, d.importance, d.content, coalesce(d.speaker, ''), coalesce(d.context, ''),
                          coalesce(d.occurred_at::text, ''),
                          (SELECT json_object_agg(u.lexeme, coalesce(array_length(u.positions, 1), 1))
                             FROM unnest(to_tsvector('english', d.content)) u)
                     FROM drawers d JOIN drawer_sources ds ON ds.workspace_id = d.workspace_id AND ds.drawer_id = d.id
                     JOIN messages m ON m.workspace_id = ds.workspace_id AND m.session_id = ds.session_id
                                    AND m.seq = ds.seq
                    WHERE d.workspace_id = %s AND d.state <> 'merged' AND d.deleted_at IS NULL
                    GROUP BY d.workspace_id, d.id""", (ws,)).fetchall()
            ids = [r[0] for r in rows]
            dia = [list(dict.fromkeys(r[2])) for r in rows]
            sess = np.array([int(d[0][1:].split(":")[0]) for d in dia])
            qs = [(q.question, q.evidence, q.category) for q in c.questions]
            batch = getattr(emb, "_queries", None)  # one batched call when local
            qvec = (np.asarray(batch([q[0] for q in qs])) if batch
                    else np.vstack([asyncio.run(emb.embed_query(q[0])) for q in qs]))
            idx = {d: i for i, d in enumerate(ids)}
            tr, ql = [], []
            for q in qs:
                r = conn.execute(
                    """SELECT id, ts_rank_cd(tsv, x.q, 1) FROM drawers,
                              (SELECT replace(plainto_tsquery('english', %s)::text, ' & ', ' | ')::tsquery AS q) x
                        WHERE workspace_id = %s AND tsv @@ x.q""", (q[0], ws)).fetchall()
                v = np.zeros(len(ids))
                for did, rank in r:
                    if did in idx:
                        v[idx[did]] = rank
                tr.append(v)
                ql.append([x[0] for x in conn.execute(
                    "SELECT DISTINCT unnest(tsvector_to_array(to_tsvector('english', %s)))", (q[0],)).fetchall()])
            out.append(Conv(c.sample_id, ids, np.array([r[1].to_numpy() for r in rows]), dia, sess,
                            np.array([r[3] or 0 for r in rows]), np.array([float(r[4]) for r in rows]),
                            [r[5] for r in rows], [r[6] for r in rows], [r[7] for r in rows],
                            [r[8] for r in rows], [r[9] or {} for r in rows], qs, qvec, ql, tr))
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(out))
    return out


@dataclass
class Enrich:
    """What enrich derived for one conversation: its knowledge graph and its episodes."""

    aliases: dict[str, list[tuple[str, bool]]]  # alias_key → [(entity id, cased)]
    mentions: dict[str, list[int]]  # entity id → drawer indexes
    triples: list[tuple[str, str]]  # (subject id, object id)
    episode_session: np.ndarray  # per episode: the lab's session ordinal
    episode_emb: np.ndarray  # per episode: its embedding (the mean of its drawers')
    episode_text: list[str]  # per episode: summary and topics


def load_enrich(settings: Settings, data: Path, convs: list[Conv]) -> dict[str, Enrich]:
    """Episodes and graph of every dev conversation (``palace bench locomo`` runs enrich), cached beside
    the features; the first run needs the stack."""
    ident = f"{data.resolve()}|{settings.embed_model}|{settings.embed_runtime}|enrich-v1"
    path = CACHE / f"enrich-{hashlib.sha256(ident.encode()).hexdigest()[:10]}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    import psycopg
    from pgvector.psycopg import register_vector

    from palace_dev.benchmarks.locomo import _workspace

    db_url = json.loads((settings.devstack_dir / "stack.json").read_text())["database_url"]
    out = {}
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        for c in convs:
            ws = _workspace(c.sample_id, settings, data)
            pos = {d: i for i, d in enumerate(c.ids)}
            aliases: dict[str, list[tuple[str, bool]]] = {}
            for key, eid, cased in conn.execute(
                    "SELECT alias_key, entity_id, cased FROM entity_aliases WHERE workspace_id = %s", (ws,)):
                aliases.setdefault(key, []).append((eid, cased))
            mentions: dict[str, list[int]] = {}
            for eid, did in conn.execute(
                    "SELECT entity_id, drawer_id FROM entity_mentions WHERE workspace_id = %s", (ws,)):
                if did in pos:
                    mentions.setdefault(eid, []).append(pos[did])
            triples = [(a, b) for a, b in conn.execute(
                "SELECT subject_id, object_id FROM triples WHERE workspace_id = %s", (ws,))]
            by_session: dict[str, int] = {}
            for did, sid in conn.execute("SELECT id, session_id FROM drawers WHERE workspace_id = %s", (ws,)):
                if did in pos:
                    by_session[sid] = int(c.session[pos[did]])
            eps = conn.execute(
                """SELECT session_id, embedding, summary || ' ' || array_to_string(topics, ' ') FROM episodes
                    WHERE workspace_id = %s AND status = 'ready' AND embedding IS NOT NULL ORDER BY session_id""",
                (ws,)).fetchall()
            eps = [e for e in eps if e[0] in by_session]
            out[c.sample_id] = Enrich(aliases, mentions, triples, np.array([by_session[e[0]] for e in eps]),
                                      np.array([e[1].to_numpy() for e in eps]), [e[2] for e in eps])
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(out))
    return out


def lab_graph(c: Conv, en: Enrich, question: str, gp: GraphParams = GraphParams()) -> dict[int, float]:
    """Drawer index → graph strength, as shared/db/graph_recall.py computes it for ``question``."""
    names = query_names(question, gp.max_words)
    named: list[str] = []
    for key in names.any_alias:
        named += [e for e, _ in en.aliases.get(key, [])]
    for key in names.uncased_only:
        named += [e for e, cased in en.aliases.get(key, []) if not cased]
    named = sorted(set(named))[: gp.max_entities]
    hop = sorted({b for a, b in en.triples if a in named} | {a for a, b in en.triples if b in named}
                 - set(named))[: gp.max_hops]
    rows = []
    for hops, ents in ((0, named), (1, hop)):
        for e in ents:
            ds = en.mentions.get(e, [])
            rows += [(str(d), e, hops, len(ds)) for d in ds]
    return {int(k): v for k, v in graph_strengths(rows, len(c.ids), gp).items()}


def lab_episodes(c: Conv, en: Enrich, qi: int, rp: RankParams, mode: str) -> dict[int, float]:
    """Session ordinal → 0–1 strength of its episode for question ``qi``: ``band`` maps the episode's
    cosine on the drawers' band, ``rank`` gives the k-th nearest episode 1/k."""
    if not len(en.episode_emb):
        return {}
    cos = en.episode_emb @ c.qvec[qi]
    if mode == "band":
        v = np.clip((cos - rp.cos_floor) / (rp.cos_ceiling - rp.cos_floor), 0, 1)
    else:
        v = np.zeros(len(cos))
        v[np.argsort(-cos)[:5]] = 1 / np.arange(1, 6)[: min(5, len(cos))]
    return {int(s): float(x) for s, x in zip(en.episode_session, v, strict=True)}


def evaluate(convs: list[Conv], scorer: Callable[[Conv, int], np.ndarray]) -> dict[str, float]:
    res = []
    for c in convs:
        for qi, (_, ev, cat) in enumerate(c.questions):
            s = scorer(c, qi)
            order = np.argsort(-s, kind="stable")[:30]
            res.append(QuestionResult(c.sample_id, cat, ev, tuple(flatten_units(c.dia[i] for i in order)), 0.0))
    s = summarize(res)
    return {"R@5": s.turn_recall_5, "R@10": s.turn_recall_10, "S@5": s.session_any_5, "S@10": s.session_any_10}


# ---- building blocks -------------------------------------------------------------------------------

def _minmax(v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    lo, hi = v[mask].min(), v[mask].max()
    return np.where(mask, (v - lo) / (hi - lo) if hi > lo else 0.0, 0.0)


def _rank(v: np.ndarray) -> np.ndarray:
    r = np.empty(len(v))
    r[np.argsort(-v, kind="stable")] = np.arange(1, len(v) + 1)
    return r


def neighbours(c: Conv) -> tuple[np.ndarray, np.ndarray]:
    """Index of the previous and the next drawer of the same session (-1: none), by seq ± 1."""
    if "nb" not in c.extra:
        pos = {(int(s), int(q)): i for i, (s, q) in enumerate(zip(c.session, c.seq, strict=True))}
        prev = np.array([pos.get((int(s), int(q) - 1), -1) for s, q in zip(c.session, c.seq, strict=True)])
        nxt = np.array([pos.get((int(s), int(q) + 1), -1) for s, q in zip(c.session, c.seq, strict=True)])
        c.extra["nb"] = (prev, nxt)
    return c.extra["nb"]  # type: ignore[return-value]


def bm25(c: Conv, qi: int, k1: float = 1.2, b: float = 0.75, within: np.ndarray | None = None) -> np.ndarray:
    """Okapi BM25 over the workspace's drawers (content lexemes), document frequencies of the workspace
    (or, with ``within``, of those drawers only: what SQL can count cheaply among its candidates)."""
    if "df" not in c.extra:
        df: dict[str, int] = {}
        for lx in c.lex:
            for t in lx:
                df[t] = df.get(t, 0) + 1
        c.extra["df"] = df
        c.extra["dl"] = np.array([sum(lx.values()) for lx in c.lex], dtype=float)
    df = c.extra["df"]
    dl = c.extra["dl"]
    n = len(c.lex)
    avg = dl.mean() if within is None else dl[within].mean()
    s = np.zeros(n)
    for t in c.qlex[qi]:
        tf = np.array([lx.get(t, 0) for lx in c.lex], dtype=float)
        if within is None:
            f, nn = df.get(t, 0), n  # type: ignore[union-attr]
        else:
            f, nn = int((tf[within] > 0).sum()), int(within.sum())
        if not f:
            continue
        idf = np.log(1 + (nn - f + 0.5) / (f + 0.5))
        s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avg))
    return s


@dataclass(frozen=True)
class P:
    """Knobs of the ranking; the defaults are what shared/db/search.py ships."""

    n_ann: int = 100
    n_fts: int = 100
    w_dense: float = 0.65
    w_text: float = 0.35
    smooth: float = 0.2
    sess: float = 0.3
    sess_top: int = 3
    w_imp: float = 0.02
    text: str = "bm25-local"  # tsrank (ts_rank_cd) | bm25 (workspace df) | bm25-local (df among candidates)
    fusion: str = "minmax"  # minmax | rrf
    rrf_k: float = 60.0
    prf_m: int = 0  # pseudo-relevance feedback: mean of the top-m drawer vectors added to the query
    prf_beta: float = 0.0
    smooth_mode: str = "max"  # max | mean | both
    dense_next: float = 0.0  # add w × cosine of the next turn (answer follows question)
    speaker_boost: float = 0.3  # add w when the drawer's speaker is named in the query
    sess_dense: bool = False  # session strength from dense similarity alone
    sess_mode: str = "mean"  # mean | max | sum-softmax
    smooth2: float = 0.0  # second-ring neighbours (seq ± 2)


def scored(c: Conv, qi: int, p: P) -> np.ndarray:
    """The earlier SQL statement, generalised: every knob of P at its default reproduces its recall
    (the speaker match is a word match on the question here, a stemmed lexeme match in SQL)."""
    q = c.qvec[qi]
    cos = c.emb @ q
    if p.prf_m:
        top = np.argsort(-cos)[: p.prf_m]
        q2 = q + p.prf_beta * c.emb[top].mean(axis=0)
        cos = c.emb @ (q2 / np.linalg.norm(q2))
    text = c.text_rank[qi] if p.text in ("tsrank", "bm25-local") else bm25(c, qi)
    n = len(cos)
    cand = np.zeros(n, bool)
    cand[np.argsort(-cos, kind="stable")[: p.n_ann]] = True
    matched = np.flatnonzero(text > 0)
    cand[matched[np.argsort(-text[matched], kind="stable")[: p.n_fts]]] = True
    if p.text == "bm25-local":  # candidates chosen by ts_rank_cd, then ranked by BM25 with candidate df
        text = bm25(c, qi, within=cand)
    if p.fusion == "minmax":
        d = _minmax(cos, cand)
        t = np.where(cand, text / max(text[cand].max(), 1e-12), 0.0)
        s = p.w_dense * d + p.w_text * t
    else:
        rc = _rank(np.where(cand, cos, -np.inf))
        rt = _rank(np.where(cand & (text > 0), text, -np.inf))
        s = p.w_dense / (p.rrf_k + rc) + p.w_text * (text > 0) / (p.rrf_k + rt)
        s = s / (1 / (p.rrf_k + 1))  # roughly 0..1 like min-max
    if p.dense_next:
        prev, nxt = neighbours(c)
        s = s + p.dense_next * np.where(nxt >= 0, _minmax(cos, np.ones(n, bool))[nxt], 0.0)
    if p.speaker_boost:
        ql = c.questions[qi][0].lower()
        named = np.array([bool(sp) and re.search(rf"\b{re.escape(sp.lower())}\b", ql) is not None
                          for sp in c.speaker])
        s = s + p.speaker_boost * named
    s = np.where(cand, s, 0.0)
    prev, nxt = neighbours(c)
    sp = np.where((prev >= 0) & cand[prev], s[prev], 0.0)
    sn = np.where((nxt >= 0) & cand[nxt], s[nxt], 0.0)
    if p.smooth_mode == "max":
        nb = np.maximum(sp, sn)
    elif p.smooth_mode == "mean":
        nb = (sp + sn) / 2
    else:
        nb = np.maximum(sp, sn) + (sp + sn) / 2
    sm = s + p.smooth * nb
    if p.smooth2:
        pp = np.where(prev >= 0, prev[np.maximum(prev, 0)], -1)
        nn = np.where(nxt >= 0, nxt[np.maximum(nxt, 0)], -1)
        s2 = np.maximum(np.where((pp >= 0) & cand[pp], s[pp], 0.0), np.where((nn >= 0) & cand[nn], s[nn], 0.0))
        sm = sm + p.smooth2 * s2
    top_s = np.zeros(n)
    for sid in np.unique(c.session):
        m = (c.session == sid) & cand
        if m.any():
            base = (_minmax(cos, cand) if p.sess_dense else sm)[m]
            top = np.sort(base)[::-1][: p.sess_top]
            top_s[c.session == sid] = top.mean() if p.sess_mode == "mean" else top.max()
    final = (sm + p.sess * top_s) * (1 + p.w_imp * (c.importance - 3))
    return np.where(cand, final, -np.inf)


def speaker_lexemes(convs: list[Conv]) -> dict[str, frozenset[str]]:
    """Each speaker's lexemes as PostgreSQL stems them (what the drawer's ``tsv`` holds at weight D),
    cached beside the features; the first run needs the stack."""
    path = CACHE / "speakers.json"
    names = sorted({sp for c in convs for sp in c.speaker})
    known: dict[str, list[str]] = json.loads(path.read_text()) if path.exists() else {}
    if not set(names) <= set(known):
        import psycopg

        db_url = json.loads((Settings().devstack_dir / "stack.json").read_text())["database_url"]
        with psycopg.connect(db_url) as conn:
            for n in names:
                row = conn.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", (n,)).fetchone()
                known[n] = list(row[0]) if row else []
        path.write_text(json.dumps(known))
    return {n: frozenset(v) for n, v in known.items()}


def product_candidates(c: Conv, qi: int, sp: dict[str, frozenset[str]], n_ann: int = 100, n_fts: int = 100,
                       n_date: int = 50, graph: dict[int, float] | None = None,
                       episode: dict[int, float] | None = None, episode_turns: int = 0) -> list[Candidate]:
    """The candidates shared/db/search.py fetches for question ``qi``, as ``rank`` receives them: nearest
    by cosine ∪ the full-text matches holding most query lexemes ∪ the nearest of those inside a window
    the question names."""
    cos = c.emb @ c.qvec[qi]
    chosen = set(np.argsort(-cos, kind="stable")[:n_ann].tolist())
    # full-text candidates as migration 0006 picks them: most of the query's lexemes (content or speaker),
    # then the drawer with fewer lexemes
    q = set(c.qlex[qi])
    held = [set(lx) | sp.get(who, frozenset()) for lx, who in zip(c.lex, c.speaker, strict=True)]
    order = sorted((i for i, h in enumerate(held) if q & h), key=lambda i: (-len(q & held[i]), len(held[i]), c.ids[i]))
    chosen |= set(order[:n_fts])
    windows = date_windows(c.questions[qi][0])
    if "occ" not in c.extra:
        c.extra["occ"] = [datetime.fromisoformat(o.replace("+00", "+00:00")) if o else None for o in c.occurred]
    occ = c.extra["occ"]
    dated = np.array([o is not None and any(lo <= o < hi for lo, hi in windows) for o in occ])
    if windows and dated.any():
        idx = np.flatnonzero(dated)
        chosen |= set(idx[np.argsort(-cos[idx], kind="stable")[:n_date]].tolist())
    graph = graph or {}
    episode = episode or {}
    chosen |= set(graph)
    if episode_turns and episode:  # the nearest turns of the best episodes' sessions
        for sess in sorted(episode, key=lambda x: -episode[x])[:3]:
            idx = np.flatnonzero(c.session == sess)
            chosen |= set(idx[np.argsort(-cos[idx], kind="stable")[:episode_turns]].tolist())
    sess_ids = [str(s) for s in c.session]
    return [Candidate(c.ids[i], sess_ids[i], int(c.seq[i]), float(cos[i]), c.lex[i], sum(c.lex[i].values()),
                      sp.get(c.speaker[i], frozenset()), bool(dated[i]), float(c.importance[i]), 0.0,
                      graph=graph.get(i, 0.0), episode=episode.get(int(c.session[i]), 0.0))
            for i in sorted(chosen)]


def product_scorer(rp: RankParams, sp: dict[str, frozenset[str]], **cand_kw: int) -> Callable[[Conv, int], np.ndarray]:
    """Scores as the product ranks: shared/memory/ranking.py over ``product_candidates`` (recency is the
    same for every drawer of a benchmark run, so age 0 here)."""
    def score(c: Conv, qi: int) -> np.ndarray:
        cands = product_candidates(c, qi, sp, **cand_kw)
        out = np.full(len(c.ids), -np.inf)
        pos = {d: i for i, d in enumerate(c.ids)}
        for r, hit in enumerate(rank(cands, c.qlex[qi], rp, 30)):
            out[pos[hit.id]] = 30 - r
        return out
    return score


def held_out(convs: list[Conv], sp: dict[str, frozenset[str]]) -> None:
    """Leave one conversation out: pick the fusion weights on the other conversations (a small grid
    around what ships), score the one left out with them, and compare with what the shipped weights
    score on it. A ranking tuned to its data would lose much on the conversation it did not see; the
    table shows how much this one does, as a stand-in for the held-out files the team does not have."""
    from itertools import product

    from rich.console import Console
    from rich.table import Table

    cands = {(c.sample_id, qi): product_candidates(c, qi, sp) for c in convs for qi in range(len(c.questions))}

    def per_conv(rp: RankParams) -> dict[str, dict[str, float]]:
        out = {}
        for c in convs:
            res = []
            for qi, (_, ev, cat) in enumerate(c.questions):
                pos = {d: i for i, d in enumerate(c.ids)}
                order = [pos[h.id] for h in rank(cands[(c.sample_id, qi)], c.qlex[qi], rp, 30)]
                res.append(QuestionResult(c.sample_id, cat, ev, tuple(flatten_units(c.dia[i] for i in order)), 0.0))
            sm = summarize(res)
            out[c.sample_id] = {"R@10": sm.turn_recall_10, "S@5": sm.session_any_5, "n": float(len(res))}
        return out

    grid = [RankParams(w_date=wd, w_speaker=ws, smooth=sm, session_boost=sb, w_dense=wde, w_text=1 - wde,
                       session_cap=cap)
            for wd, ws, sm, sb, wde, cap in product((0.2, 0.3, 0.4), (0.4, 0.5, 0.6), (0.2, 0.3, 0.4),
                                                    (0.2, 0.3, 0.4), (0.5, 0.55, 0.6), (0, 1))]
    scores = [per_conv(rp) for rp in grid]
    shipped = per_conv(RankParams())
    t = Table(title=f"held-out check: weights chosen on the other conversations ({len(grid)} candidates)")
    for col in ("left out", "questions", "chosen w_date/speaker/smooth/session/dense/cap", "R@10 held out",
                "R@10 shipped", "S@5 held out", "S@5 shipped"):
        t.add_column(col)
    tot = {"ho_r": 0.0, "sh_r": 0.0, "ho_s": 0.0, "sh_s": 0.0, "n": 0.0}
    for c in convs:
        def fit(sc: dict[str, dict[str, float]], left: str = c.sample_id) -> float:
            rest = [v for k, v in sc.items() if k != left]
            n = sum(v["n"] for v in rest)
            return sum((v["R@10"] + v["S@5"]) * v["n"] for v in rest) / n
        best = max(range(len(grid)), key=lambda i: fit(scores[i]))
        rp, ho, sh = grid[best], scores[best][c.sample_id], shipped[c.sample_id]
        n = ho["n"]
        tot["n"] += n
        for key, v in (("ho_r", ho["R@10"]), ("sh_r", sh["R@10"]), ("ho_s", ho["S@5"]), ("sh_s", sh["S@5"])):
            tot[key] += v * n
        chosen = f"{rp.w_date}/{rp.w_speaker}/{rp.smooth}/{rp.session_boost}/{rp.w_dense}/{rp.session_cap}"
        t.add_row(c.sample_id, f"{n:.0f}", chosen,
                  f"{ho['R@10']:.3f}", f"{sh['R@10']:.3f}", f"{ho['S@5']:.3f}", f"{sh['S@5']:.3f}")
    n = tot["n"]
    t.add_row("all", f"{n:.0f}", "", f"{tot['ho_r'] / n:.3f}", f"{tot['sh_r'] / n:.3f}", f"{tot['ho_s'] / n:.3f}",
              f"{tot['sh_s'] / n:.3f}")
    Console(width=150).print(t)


def enrich_cands(convs: list[Conv], sp: dict[str, frozenset[str]], en: dict[str, Enrich], *,
                 graph: bool = True, episode: str = "", episode_turns: int = 0,
                 gp: GraphParams = GraphParams()) -> dict[tuple[str, int], list[Candidate]]:
    """Every question's candidates with the graph and/or episode signals attached."""
    out = {}
    for c in convs:
        e = en[c.sample_id]
        for qi in range(len(c.questions)):
            g = lab_graph(c, e, c.questions[qi][0], gp) if graph else None
            ep = lab_episodes(c, e, qi, RankParams(), episode) if episode else None
            out[(c.sample_id, qi)] = product_candidates(c, qi, sp, graph=g, episode=ep, episode_turns=episode_turns)
    return out


def per_conv(convs: list[Conv], cands: dict[tuple[str, int], list[Candidate]],
             rp: RankParams) -> dict[str, dict[str, object]]:
    """Per conversation: the question results of ``rank`` over ``cands``."""
    out: dict[str, dict[str, object]] = {}
    for c in convs:
        pos = {d: i for i, d in enumerate(c.ids)}
        res = []
        for qi, (_, ev, cat) in enumerate(c.questions):
            order = [pos[h.id] for h in rank(cands[(c.sample_id, qi)], c.qlex[qi], rp, 30)]
            res.append(QuestionResult(c.sample_id, cat, ev, tuple(flatten_units(c.dia[i] for i in order)), 0.0))
        out[c.sample_id] = {"res": res}
    return out


def _line(name: str, res: list[QuestionResult]) -> str:
    sm = summarize(res)
    cats = " ".join(f"{k}:{v['turn_recall@10']:.3f}/{v['session_recall_any@5']:.3f}"
                    for k, v in sorted(sm.per_category.items()))
    return f"{name:52s} {sm.turn_recall_10:.3f} {sm.session_any_5:.3f}  {cats}"


def enrich_report(convs: list[Conv], sp: dict[str, frozenset[str]], en: dict[str, Enrich]) -> None:
    """The graph and episode signals on LoCoMo-dev: variants in-sample by category, then a
    leave-one-conversation-out choice of their weights (everything else as shipped)."""
    n_ent = sum(len(e.mentions) for e in en.values())
    n_tri = sum(len(e.triples) for e in en.values())
    print(f"entities with mentions {n_ent}, triples {n_tri}, episodes {sum(len(e.episode_text) for e in en.values())}")
    base = enrich_cands(convs, sp, en, graph=False)
    with_graph = enrich_cands(convs, sp, en)
    variants: dict[str, tuple[dict[tuple[str, int], list[Candidate]], RankParams]] = {
        "shipped": (base, RankParams()),
        "graph candidates, weight 0": (with_graph, RankParams()),
        **{f"graph weight {w}": (with_graph, RankParams(w_graph=w)) for w in (0.1, 0.2, 0.3, 0.5)},
    }
    for mode in ("band", "rank"):
        ep = enrich_cands(convs, sp, en, graph=False, episode=mode)
        variants |= {f"episode ({mode}) weight {w}": (ep, RankParams(w_episode=w)) for w in (0.1, 0.2, 0.4)}
    for turns in (5, 10):
        ep = enrich_cands(convs, sp, en, graph=False, episode="rank", episode_turns=turns)
        variants[f"episode (rank) 0.1 + its {turns} nearest turns as candidates"] = (ep, RankParams(w_episode=0.1))
    print(f"{'variant':52s} R@10  S@5    per category R@10/S@5")
    for name, (cands, rp) in variants.items():
        res = [r for v in per_conv(convs, cands, rp).values() for r in v["res"]]  # type: ignore[attr-defined]
        print(_line(name, res), flush=True)
    both = enrich_cands(convs, sp, en, episode="rank")
    grid = [RankParams(w_graph=g, w_episode=e) for g in (0.0, 0.1, 0.2, 0.3, 0.5) for e in (0.0, 0.1, 0.2, 0.4)]
    scores = [per_conv(convs, both, rp) for rp in grid]
    shipped = per_conv(convs, base, RankParams())
    held, ship = [], []
    for c in convs:
        def fit(i: int, left: str = c.sample_id) -> float:
            rest = [r for k, v in scores[i].items() if k != left for r in v["res"]]  # type: ignore[attr-defined]
            sm = summarize(rest)
            return sm.turn_recall_10 + sm.session_any_5
        best = max(range(len(grid)), key=fit)
        held += scores[best][c.sample_id]["res"]  # type: ignore[arg-type]
        ship += shipped[c.sample_id]["res"]  # type: ignore[arg-type]
        print(f"{c.sample_id}: chose graph {grid[best].w_graph} episode {grid[best].w_episode}", flush=True)
    print(_line("held out (graph/episode weights chosen on the other 4)", held))
    print(_line("shipped weights, no graph or episode", ship))


def foreign_questions(convs: list[Conv], *, named: bool, every: int = 4) -> list[tuple[Conv, int]]:
    """Questions nobody in a conversation could answer: every ``every``-th question of each other
    conversation, asked of this one. With ``named`` its speakers' names stand in for the first's (first
    speaker for first speaker), so the question names someone who is there ("Where will Maria work from
    next year?" asked where Maria never spoke of work); without, it names people who are not. The
    question's vector is the original's: names weigh little in it. Returns (the conversation holding
    those questions, question index) pairs."""
    def speakers(c: Conv) -> list[str]:
        return list(dict.fromkeys(s for s in c.speaker if s))[:2]

    sp = speaker_lexemes(convs)
    out = []
    for a in convs:
        for b in convs:
            if b is a:
                continue
            swap: dict[str, str] = {}
            if named:
                for x, y in zip(speakers(a), speakers(b), strict=False):
                    swap |= dict(zip(sorted(sp[x]), sorted(sp[y]), strict=False))
            qs = list(range(0, len(a.questions), every))
            asked = replace(b, questions=[a.questions[i] for i in qs], qvec=a.qvec[qs],
                            qlex=[[swap.get(x, x) for x in a.qlex[i]] for i in qs], extra={})
            out += [(asked, qi) for qi in range(len(qs))]
    return out


INJECT_FALSE_BUDGET = 0.10  # what share of questions about what no one there said may get anything injected


def inject_report(convs: list[Conv], sp: dict[str, frozenset[str]], rp: RankParams = RankParams()) -> None:
    """Auto-inject's threshold. Per threshold: how often a question gets a turn of its evidence injected
    (among the top 10 at or above it), how often it gets anything, and how often a question nobody there
    could answer (``foreign_questions``) gets anything, naming no one there or someone there. The rule:
    the lowest threshold at which a question naming no one there gets anything injected at most
    ``INJECT_FALSE_BUDGET`` of the time, chosen on four conversations and applied to the fifth."""
    from rich.console import Console
    from rich.table import Table

    def top_of(asked: Conv, qi: int) -> float:
        hits = rank(product_candidates(asked, qi, sp), asked.qlex[qi], rp, 10)
        return hits[0].score if hits else 0.0

    evidence: dict[str, list[float]] = {}
    top: dict[str, list[float]] = {}
    for c in convs:
        pos = {d: i for i, d in enumerate(c.ids)}
        for qi, (_, ev, _) in enumerate(c.questions):
            hits = rank(product_candidates(c, qi, sp), c.qlex[qi], rp, 10)
            found = [h.score for h in hits if set(ev) & set(c.dia[pos[h.id]])]
            evidence.setdefault(c.sample_id, []).append(max(found, default=0.0))
            top.setdefault(c.sample_id, []).append(hits[0].score if hits else 0.0)
    stranger: dict[str, list[float]] = {}
    known: dict[str, list[float]] = {}
    for out, named in ((stranger, False), (known, True)):
        for asked, qi in foreign_questions(convs, named=named):
            out.setdefault(asked.sample_id, []).append(top_of(asked, qi))
    ev, tp, fs, fk = ({k: np.array(v) for k, v in d.items()} for d in (evidence, top, stranger, known))

    def rate(d: dict[str, np.ndarray], t: float, skip: str = "") -> float:
        return float(np.mean(np.concatenate([v for k, v in d.items() if k != skip]) >= t))

    cols = ("evidence injected", "anything injected", "unanswerable, naming no one there: anything",
            "unanswerable, naming someone there: anything")
    t = Table(title=f"auto-inject threshold: {sum(map(len, ev.values()))} LoCoMo-dev questions; "
                    f"{sum(map(len, fs.values()))} asked of a conversation that cannot answer them")
    for col in ("threshold", *cols):
        t.add_column(col, justify="right")
    for th in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65):
        t.add_row(f"{th}", *(f"{rate(d, th):.3f}" for d in (ev, tp, fs, fk)))
    Console(width=160).print(t)
    grid = np.round(np.arange(0.30, 0.80, 0.01), 2)
    h = Table(title=f"the rule (naming no one there: anything injected ≤ {INJECT_FALSE_BUDGET}) on the other "
                    "four conversations, applied to the one left out")
    for col in ("left out", "chosen", *cols):
        h.add_column(col, justify="right")
    for k in ev:
        best = float(next((g for g in grid if rate(fs, g, k) <= INJECT_FALSE_BUDGET), grid[-1]))
        h.add_row(k, f"{best:.2f}", *(f"{np.mean(d[k] >= best):.3f}" for d in (ev, tp, fs, fk)))
    Console(width=160).print(h)

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/locomo-dev.json"))
    ap.add_argument("--only", default="", help="comma-separated variant name prefixes")
    ap.add_argument("--held-out", action="store_true", help="leave-one-conversation-out check of the weights")
    ap.add_argument("--enrich", action="store_true", help="the graph and episode signals (needs enrich's output)")
    ap.add_argument("--inject", action="store_true", help="auto-inject's threshold against unanswerable questions")
    args = ap.parse_args()
    convs = load(Settings(), args.data)
    if args.inject:
        inject_report(convs, speaker_lexemes(convs), RankParams())
        return
    if args.enrich:
        enrich_report(convs, speaker_lexemes(convs), load_enrich(Settings(), args.data, convs))
        return
    if args.held_out:
        held_out(convs, speaker_lexemes(convs))
        return
    before = P(text="tsrank", w_dense=0.75, w_text=0.25, speaker_boost=0.0)  # the statement before the speaker signal
    variants: dict[str, P] = {
        "before: ts_rank_cd, 0.75/0.25": before,
        "rrf (k=60) instead of min-max": replace(before, fusion="rrf", w_dense=1, w_text=1),
        "prf: + mean of top-3 vectors x0.5": replace(before, prf_m=3, prf_beta=0.5),
        "prf: + mean of top-5 vectors x1": replace(before, prf_m=5, prf_beta=1.0),
        "speaker named 0.3 (on ts_rank_cd)": replace(before, speaker_boost=0.3),
        "bm25 (workspace df)": replace(before, text="bm25"),
        "bm25 (candidate df)": replace(before, text="bm25-local"),
        "bm25 (candidate df), 0.65/0.35": replace(before, text="bm25-local", w_dense=0.65, w_text=0.35),
        "bm25, 0.65/0.35": replace(before, text="bm25", w_dense=0.65, w_text=0.35),
        "bm25, + speaker named 0.3": replace(before, text="bm25", speaker_boost=0.3),
        "bm25, 0.65/0.35, + speaker 0.3": replace(before, text="bm25", w_dense=0.65, w_text=0.35, speaker_boost=0.3),
        "sql fusion: bm25 (candidate df), 0.65/0.35, speaker": P(),
        "sql fusion, session strength from its best turn": P(sess_top=1),
        "sql fusion, second-ring smoothing 0.1": P(smooth2=0.1),
        "sql fusion, + next turn's cosine 0.1": P(dense_next=0.1),
        "sql fusion, all 200 candidates each way": P(n_ann=200, n_fts=200),
    }
    sp = speaker_lexemes(convs)
    product: dict[str, Callable[[Conv, int], np.ndarray]] = {
        "product: shared/memory/ranking.py as shipped": product_scorer(RankParams(), sp),
        "product without time windows (w_date 0, no dated candidates)":
            product_scorer(RankParams(w_date=0.0), sp, n_date=0),
        "product, time windows as a signal only (no dated candidates)": product_scorer(RankParams(), sp, n_date=0),
        **{f"product, window weight {w}": product_scorer(RankParams(w_date=w), sp) for w in (0.2, 0.4, 0.5)},
        **{f"product, {n} candidates each way": product_scorer(RankParams(), sp, n_ann=n, n_fts=n) for n in (60, 40)},
        **{f"product, at most {c} of one session in the top {t}" + (f" of the best {n}" if n else ""):
           product_scorer(RankParams(session_cap=c, capped_top=t, capped_pool=n), sp)
           for c, t, n in ((1, 5, 0), (2, 5, 0), (3, 5, 0), (1, 5, 10), (2, 5, 10), (1, 5, 8), (1, 5, 15),
                           (1, 5, 20), (1, 4, 10), (1, 3, 10))},
    }
    print(f"{'variant':44s} R@5    R@10   S@5    S@10")
    for name, scorer in product.items():
        if args.only and not any(name.startswith(o) for o in args.only.split(",")):
            continue
        r = evaluate(convs, scorer)
        print(f"{name:44s} {r['R@5']:.3f}  {r['R@10']:.3f}  {r['S@5']:.3f}  {r['S@10']:.3f}", flush=True)
    for name, p in variants.items():
        if args.only and not any(name.startswith(o) for o in args.only.split(",")):
            continue
        r = evaluate(convs, lambda c, q, p=p: scored(c, q, p))
        print(f"{name:44s} {r['R@5']:.3f}  {r['R@10']:.3f}  {r['S@5']:.3f}  {r['S@10']:.3f}", flush=True)


if __name__ == "__main__":
    main()
