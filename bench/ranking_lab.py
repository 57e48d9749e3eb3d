"""Ranking lab: evaluate fusion variants on LoCoMo-dev in seconds, from features read once.

Run ``palace bench locomo --reuse`` first (it ingests the dev conversations through the pipeline); this
reads, per question, every drawer's dense similarity (exact, numpy) and full-text rank (PostgreSQL
``ts_rank_cd``, the index the product uses) and scores ranking formulas offline. Winners move into the
one SQL statement in shared/db/search.py and are confirmed there by ``palace bench locomo``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from services.benchmarks.locomo import _workspace
from shared.adapters import build_embedder
from shared.config import Settings
from shared.evaluation.locomo import load_locomo
from shared.evaluation.metrics import QuestionResult, flatten_units, summarize


@dataclass
class Conv:
    sample_id: str
    ids: list[str]
    emb: np.ndarray
    dia: list[list[str]]
    session: np.ndarray  # session ordinal per drawer
    seq: np.ndarray  # position within the conversation
    questions: list  # (question, evidence, category)
    qvec: np.ndarray
    text_rank: list[np.ndarray]  # per question: ts_rank_cd per drawer (0 if no match)


def load(settings: Settings, data: Path, db_url: str) -> list[Conv]:
    convs = load_locomo(data)
    emb = build_embedder(settings)
    out = []
    with psycopg.connect(db_url) as conn:
        register_vector(conn)
        for c in convs:
            ws = _workspace(c.sample_id, settings, data)
            rows = conn.execute(
                """SELECT d.id, d.embedding, array_agg(m.metadata->>'dia_id' ORDER BY ds.session_id, ds.seq)
                     FROM drawers d JOIN drawer_sources ds ON ds.workspace_id = d.workspace_id AND ds.drawer_id = d.id
                     JOIN messages m ON m.workspace_id = ds.workspace_id AND m.session_id = ds.session_id
                                    AND m.seq = ds.seq
                    WHERE d.workspace_id = %s AND d.state <> 'merged' GROUP BY d.id, d.embedding""", (ws,)).fetchall()
            ids = [r[0] for r in rows]
            dia = [list(dict.fromkeys(r[2])) for r in rows]
            first = [d[0] for d in dia]
            sess = np.array([int(d[1:].split(":")[0]) for d in first])
            turn = np.array([int(d.split(":")[1]) for d in first])
            order = np.lexsort((turn, sess))
            pos = np.empty(len(ids), dtype=int)
            pos[order] = np.arange(len(ids))
            qs = [(q.question, q.evidence, q.category) for q in c.questions]
            qvec = np.vstack([asyncio.run(emb.embed_query(q[0])) for q in qs])
            idx = {d: i for i, d in enumerate(ids)}
            tr = []
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
            out.append(Conv(c.sample_id, ids, np.array([r[1].to_numpy() for r in rows]), dia, sess, pos, qs, qvec, tr))
    return out


def evaluate(convs: list[Conv], scorer: Callable[[Conv, int], np.ndarray],
             expand: Callable[[Conv, np.ndarray], list[list[str]]] | None = None) -> dict[str, float]:
    res = []
    for c in convs:
        for qi, (_, ev, cat) in enumerate(c.questions):
            s = scorer(c, qi)
            order = np.argsort(-s, kind="stable")[:40]
            units = expand(c, order) if expand else [c.dia[i] for i in order]
            res.append(QuestionResult(c.sample_id, cat, ev, tuple(flatten_units(units)), 0.0))
    s = summarize(res)
    return {"R@5": s.turn_recall_5, "R@10": s.turn_recall_10, "S@5": s.session_any_5, "S@10": s.session_any_10}


def _minmax(v: np.ndarray) -> np.ndarray:
    lo, hi = v.min(), v.max()
    return (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)


def _rank(v: np.ndarray) -> np.ndarray:
    r = np.empty(len(v))
    r[np.argsort(-v, kind="stable")] = np.arange(1, len(v) + 1)
    return r


def dense(c: Conv, qi: int) -> np.ndarray:
    return c.emb @ c.qvec[qi]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/locomo-dev.json"))
    args = ap.parse_args()
    settings = Settings()
    db_url = json.loads((settings.devstack_dir / "stack.json").read_text())["database_url"]
    convs = load(settings, args.data, db_url)
    variants: dict[str, Callable[[Conv, int], np.ndarray]] = {
        "dense": dense,
        "text": lambda c, q: c.text_rank[q],
        "0.7 cos + 0.3 text/max": lambda c, q: (
            0.7 * dense(c, q) + 0.3 * c.text_rank[q] / max(c.text_rank[q].max(), 1e-9)),
        "rrf60": lambda c, q: 1 / (60 + _rank(dense(c, q))) + 1 / (60 + _rank(c.text_rank[q])) * (c.text_rank[q] > 0),
    }
    for w in (0.5, 0.6, 0.7, 0.8):
        variants[f"{w} minmax(cos) + {1 - w:.1f} minmax(text)"] = (
            lambda c, q, w=w: w * _minmax(dense(c, q)) + (1 - w) * _minmax(c.text_rank[q]))
    for name, fn in variants.items():
        print(f"{name:40s}", {k: round(v, 3) for k, v in evaluate(convs, fn).items()})


if __name__ == "__main__":
    main()
