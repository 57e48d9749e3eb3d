"""Search latency with and without the knowledge-graph signal, on the LoCoMo-dev workspaces, in one run.

Run ``palace bench locomo`` first (it ingests the dev conversations and, with enrich, their episodes
and entities), then ``palace stack start``. Every question is searched through ``Recaller`` (query
embedding included) once with the graph signal off and once on, each with its own embedding cache,
the order alternating question by question so background load hits both alike. Prints p50/p95 of
each, their ratio, how often the graph lookup found anything, and writes bench/results/recall_signals.json.

    .venv/bin/python bench/recall_signals.py [--data ../shared/bench/locomo-dev.json] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from palace_dev.benchmarks.locomo import _workspace
from palace_dev.evaluation.locomo import load_locomo
from shared.adapters import build_embedder
from shared.config import Settings
from shared.db.pool import open_pool
from shared.db.search import SearchParams
from shared.recall import Recaller


async def main(data: Path, rounds: int, w_graph: float, every: int = 1) -> dict[str, object]:
    s = Settings()
    db_url = json.loads((s.devstack_dir / "stack.json").read_text())["database_url"]
    embedder = build_embedder(s)
    warm = getattr(embedder, "warm_up", None)
    if warm:
        await warm()
    pool = await open_pool(db_url, name="bench-signals", max_size=2, role=s.db_role)
    base = SearchParams.from_settings(s)
    off = replace(base, rank=replace(base.rank, w_graph=0.0))
    on = replace(base, rank=replace(base.rank, w_graph=w_graph))
    times: dict[str, list[float]] = {"off": [], "on": []}
    reached = 0
    questions = [(_workspace(c.sample_id, s, data), q.question) for c in load_locomo(data) for q in c.questions]
    questions = questions[::every]
    try:
        for r in range(rounds):
            recallers = {"off": Recaller(pool, embedder, off, touch=False),
                         "on": Recaller(pool, embedder, on, touch=False)}
            for i, (ws, q) in enumerate(questions):
                order = ("off", "on") if (i + r) % 2 == 0 else ("on", "off")
                for name in order:
                    t0 = time.perf_counter()
                    hits = await recallers[name].search(ws, q, 30)
                    times[name].append((time.perf_counter() - t0) * 1000)
                    if name == "on" and r == 0 and any(h.explanation.graph > 0 for h in hits):
                        reached += 1
    finally:
        await pool.close()
        await embedder.aclose()

    def pct(v: list[float], p: float) -> float:
        return statistics.quantiles(v, n=100)[int(p) - 1]

    out = {
        "questions": len(questions), "rounds": rounds, "w_graph": w_graph,
        "load_average_1m": os.getloadavg()[0],
        "p50_ms_off": statistics.median(times["off"]), "p50_ms_on": statistics.median(times["on"]),
        "p95_ms_off": pct(times["off"], 95), "p95_ms_on": pct(times["on"], 95),
        "questions_with_a_graph_hit_in_top30": reached,
    }
    out["p50_ratio"] = out["p50_ms_on"] / out["p50_ms_off"]  # type: ignore[operator]
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("../shared/bench/locomo-dev.json"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--w-graph", type=float, default=0.15)
    ap.add_argument("--every", type=int, default=1, help="every n-th question only (a quicker run)")
    args = ap.parse_args()
    res = asyncio.run(main(args.data, args.rounds, args.w_graph, args.every))
    print(json.dumps(res, indent=2))
    Path("bench/results/recall_signals.json").write_text(json.dumps(res, indent=2) + "\n")
