"""What ingest's transaction costs with the checks for edited messages, against the store alone.

Since migration 0055 every ``session.completed`` is checked against what its session's positions already hold
(an edited message is kept as a revision and the drawer of its old words retired; an earlier revision coming
back writes nothing) and, for a session seen before, whether it says again words an edit had retired. That
is a per-session lock and two or three more statements in ingest's one transaction. This bench runs the
transaction both ways on the same LoCoMo sessions, alternated (each variant first in every other round), on
its own database: "store only" is what ingest ran before (the forget check, then the store statement),
"with edit checks" is today's handler's database work. Each LoCoMo session is filed as a new session (the
common case) and then published again unchanged (a replay, or a platform re-publishing a session), in a
workspace per variant.

    .venv/bin/python bench/ingest_edits.py [--rounds 3]

Prints p50 / p95 ms per transaction for each case and the ratio; writes bench/results/ingest_edits.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _common import (
    bench_servers,
    bench_settings,
    console,
    load_locomo,
    machine_info,
    own_database,
    percentiles,
    prepare_process,
    write_results,
)
from rich.table import Table


def sessions() -> list[dict[str, Any]]:
    """Every LoCoMo dev session as a ``session.completed`` body (its turns in order)."""
    turns, _ = load_locomo()
    by: dict[tuple[str, str], list[Any]] = {}
    for t in turns:
        by.setdefault((t.conv, t.session), []).append(t)
    return [{"session_id": f"{conv}-{sid}", "agent_id": "bench", "user_id": conv,
             "messages": [{"role": "user", "name": t.speaker, "content": t.text} for t in ts]}
            for (conv, sid), ts in by.items()]


async def store_only(pool: Any, plan: Any) -> None:
    from shared.db.forget import forgotten_session_drawers, writer_tx
    from shared.db.sessions import store_session
    from shared.forget import drop_forgotten_drawers

    e = plan.event
    async with writer_tx(pool, e.workspace_id) as conn:
        _, gone = await forgotten_session_drawers(conn, e.workspace_id, session_id=e.session_id, user_id=e.user_id,
                                                  agent_id=e.agent_id, drawer_ids=[d.id for d in plan.drawers])
        await store_session(conn, drop_forgotten_drawers(plan, gone))


async def with_edit_checks(pool: Any, plan: Any) -> None:
    """Today's ingest transaction (``shared.ingest.file_session``, as services/ingest/handlers.py runs it)."""
    from shared.db.forget import writer_tx
    from shared.ingest import file_session

    async with writer_tx(pool, plan.event.workspace_id) as conn:
        await file_session(conn, plan, actor="ingest", episode_wait_s=600)


VARIANTS = {"store only": store_only, "with edit checks": with_edit_checks}


async def measure(url: str, bodies: list[dict[str, Any]], rounds: int) -> dict[str, dict[str, list[float]]]:
    from shared.db.pool import open_pool
    from shared.events import SessionCompleted
    from shared.memory.filing import plan_session

    s = bench_settings()
    times: dict[str, dict[str, list[float]]] = {case: {v: [] for v in VARIANTS} for case in ("new", "replay")}
    pool = await open_pool(url, name="bench-ingest-edits", max_size=2)
    try:
        for r in range(rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
            plans = {v: [plan_session(SessionCompleted.model_validate({**b, "workspace_id": f"w{r}-{i}"}),
                                      chunk_chars=s.chunk_chars, chunk_overlap=s.chunk_overlap, min_chars=s.min_chars)
                         for b in bodies] for i, v in enumerate(VARIANTS)}
            for case in ("new", "replay"):
                for n in range(len(bodies)):
                    for v in order:
                        t0 = time.perf_counter()
                        await VARIANTS[v](pool, plans[v][n])
                        times[case][v].append((time.perf_counter() - t0) * 1000)
    finally:
        await pool.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    prepare_process()
    bodies = sessions()
    with bench_servers() as (sup, load), own_database(sup.database_url, "palace_ingest_edits") as url:
        times = asyncio.run(measure(url, bodies, args.rounds))
    table = Table(title=f"ingest's transaction, {len(bodies)} LoCoMo sessions x {args.rounds} rounds (ms)")
    for col in ("case", "store only p50 / p95", "with edit checks p50 / p95", "ratio (p50)"):
        table.add_column(col)
    out: dict[str, Any] = {"machine": machine_info(), "load_at_start": load, "sessions": len(bodies),
                           "rounds": args.rounds, "cases": {}}
    for case, by in times.items():
        a, b = percentiles(by["store only"]), percentiles(by["with edit checks"])
        out["cases"][case] = {"store_only": a, "with_edit_checks": b, "ratio_p50": b["p50"] / a["p50"]}
        table.add_row(case, f"{a['p50']:.2f} / {a['p95']:.2f}", f"{b['p50']:.2f} / {b['p95']:.2f}",
                      f"{b['p50'] / a['p50']:.2f}x")
    console.print(table)
    console.print(f"written to {write_results('ingest_edits', out)}")


if __name__ == "__main__":
    main()
