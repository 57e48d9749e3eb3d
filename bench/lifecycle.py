"""Lifecycle jobs beside search: how long decay and prune take over a workspace of N drawers, what
they do to search latency while they run, and how long forgetting a user with 10k drawers takes.

Why this shape: the jobs exist to run beside full traffic, so the figure that matters is search p99
with and without a job running, taken in the same run on the same data (a search loop runs alone,
then again while the job runs). Rows are written straight into PostgreSQL (this measures the jobs,
not ingest): N drawers filed 40 days ago with random unit vectors and spread importances (a tenth
of them prunable), plus one user with ``--forget-drawers`` drawers in sessions of 10 messages. The
workspace gets its own HNSW index, as maintain builds one at this size: search walks it, and decay's
rewrites must leave it alone (the table shows the share of HOT updates).

    .venv/bin/python bench/lifecycle.py [--drawers 100000] [--forget-drawers 10000] [--queries 300] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import numpy as np
import psycopg
from _common import (
    bench_lock,
    bench_settings,
    console,
    machine_info,
    percentiles,
    prepare_process,
    start_servers,
    write_results,
)
from psycopg import sql
from rich.table import Table

from shared.db.vector_indexes import build_vector_index, index_name_for

WS = "bench-lifecycle"
USER = "bench-forget-user"
WORDS = ["violin", "glacier", "compiler", "saffron", "tram", "orchid", "lighthouse", "ledger", "quokka", "cedar"]


def _load(db: str, n: int, n_forget: int, dim: int) -> float:
    """The workspace, written with COPY (vectors from numpy, so loading is not what takes the time), and
    its vector index; returns the seconds the index took to build."""
    rng = np.random.default_rng(0)
    with psycopg.connect(db, autocommit=True) as conn:
        for t in ("drawer_sources", "messages", "drawers", "sessions", "episodes", "embedding_cache", "memory_history",
                  "forget_tombstones", "forget_audit", "job_leases", "vector_indexes"):
            conn.execute(f"DELETE FROM {t} WHERE workspace_id IN (%s, '*')", (WS,))  # noqa: S608 - fixed names
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index_name_for(WS))))
        sessions = n_forget // 10
        with conn.cursor() as cur:
            with cur.copy("COPY sessions (workspace_id, session_id, event_id, user_id, agent_id, message_count, "
                          "content_hash) FROM STDIN") as cp:
                for s in range(sessions):
                    cp.write_row((WS, f"fs-{s:06d}", f"e{s}", USER, "bench-agent", 10, f"h{s}"))
            with cur.copy("COPY messages (workspace_id, session_id, seq, role, content, content_hash) "
                          "FROM STDIN") as cp:
                for i in range(n_forget):
                    cp.write_row((WS, f"fs-{i // 10:06d}", i % 10, "user", f"forget me {i}", f"fm{i}"))
            with cur.copy("COPY drawers (workspace_id, id, content, content_hash, embedding, embedding_model, state, "
                          "memory_type, importance, filed_at, session_id, seq, user_id, agent_id) "
                          "FROM STDIN") as cp:
                for i in range(n + n_forget):
                    v = rng.standard_normal(dim).astype(np.float32)
                    v /= np.linalg.norm(v)
                    forget = i >= n
                    words = " ".join(random.Random(i).sample(WORDS, 3))
                    cp.write_row((
                        WS, f"d{i:08d}", f"bench drawer {i} about the {words}", f"c{i}",
                        "[" + ",".join(f"{x:.5f}" for x in v) + "]", "bench", "processed", "fact",
                        (i % 50) / 10.0, "2026-01-01T00:00:00Z",
                        f"fs-{(i - n) // 10:06d}" if forget else None, (i - n) % 10 if forget else None,
                        USER if forget else "someone-else", "bench-agent" if forget else None))
            with cur.copy("COPY drawer_sources (workspace_id, drawer_id, session_id, seq) FROM STDIN") as cp:
                for j in range(n_forget):
                    cp.write_row((WS, f"d{n + j:08d}", f"fs-{j // 10:06d}", j % 10))
        conn.execute("UPDATE drawers SET filed_at = now() - interval '40 days' WHERE workspace_id = %s", (WS,))
        conn.execute("VACUUM ANALYZE drawers")
    # The workspace's own HNSW index, as maintain builds it for a workspace this size (migration 0019):
    # search walks it, and decay must leave it alone (HOT updates).
    t0 = time.perf_counter()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO vector_indexes (workspace_id, index_name, state, drawers)"
                     " VALUES (%s, %s, 'building', %s)", (WS, index_name_for(WS), n + n_forget))
    asyncio.run(build_vector_index(db, WS, index_name_for(WS)))
    return time.perf_counter() - t0


def _update_counts(db: str) -> tuple[int, int]:
    """drawers' row updates and HOT updates so far (cumulative statistics)."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'drawers'"
                           ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _search_loop(pool: Any, n: int, dim: int, stop: asyncio.Event | None, max_q: int) -> list[float]:
    """Hybrid searches (the recall SQL, with a precomputed query vector) until ``stop`` or ``max_q``."""
    from shared.db.search import SearchParams, hybrid_search
    from shared.db.tenancy import workspace_tx

    rng = np.random.default_rng(1)
    out: list[float] = []
    while len(out) < max_q and not (stop is not None and stop.is_set()):
        q = rng.standard_normal(dim).astype(np.float32)
        q /= np.linalg.norm(q)
        text = " ".join(random.Random(len(out)).sample(WORDS, 2))
        t0 = time.perf_counter()
        async with workspace_tx(pool, WS) as conn:
            await hybrid_search(conn, WS, text, q, SearchParams(), workspace_size=n, vector_index=True)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def run(args: argparse.Namespace, settings: Any, db: str, nats_url: str) -> dict[str, Any]:
    from shared.db.pool import open_pool
    from shared.forget import Scope, forget
    from shared.lifecycle import JOBS, run_job

    dim = settings.embed_dim
    with console.status(f"loading {args.drawers:,} + {args.forget_drawers:,} drawers ..."):
        t0 = time.perf_counter()
        index_s = await asyncio.to_thread(_load, db, args.drawers, args.forget_drawers, dim)
        load_s = time.perf_counter() - t0
    n = args.drawers + args.forget_drawers
    pool = await open_pool(db, name="bench-lifecycle", max_size=4)
    res: dict[str, Any] = {"load_s": load_s, "vector_index_build_s": index_s, "jobs": {}}
    try:
        await _search_loop(pool, n, dim, None, 30)  # warm up
        for job in ("decay", "prune"):
            alone = await _search_loop(pool, n, dim, None, args.queries)
            stop = asyncio.Event()
            searching = asyncio.create_task(_search_loop(pool, n, dim, stop, 10**9))
            updates, hot = _update_counts(db)
            t0 = time.perf_counter()
            counts = await run_job(JOBS[job], pool=pool, settings=settings, holder="bench", manual=True)
            job_s = time.perf_counter() - t0
            stop.set()
            beside = await searching
            await asyncio.sleep(1.5)  # backends publish their table statistics within a second
            updates2, hot2 = _update_counts(db)
            res["jobs"][job] = {"seconds": job_s, "seconds_per_100k": job_s * 100_000 / n, "counts": counts,
                                "row_updates": updates2 - updates, "hot_updates": hot2 - hot,
                                "search_alone_ms": percentiles(alone), "search_beside_ms": percentiles(beside)}
            console.print(f"{job}: {job_s:.1f} s, {counts}, {hot2 - hot:,} of {updates2 - updates:,} row updates HOT")
        t0 = time.perf_counter()
        r = await forget(pool, settings, nats_url, Scope(WS, "user", USER), requested_by="bench")
        res["forget"] = {"seconds": time.perf_counter() - t0, "drawers": args.forget_drawers, "counts": r.counts}
    finally:
        await pool.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drawers", type=int, default=100_000, help="drawers in the workspace besides the user's")
    ap.add_argument("--forget-drawers", type=int, default=10_000, help="drawers of the user forgotten")
    ap.add_argument("--queries", type=int, default=300, help="searches timed alone before each job")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 20,000 + 2,000 drawers, 100 queries")
    args = ap.parse_args()
    if args.quick:
        args.drawers, args.forget_drawers, args.queries = 20_000, 2_000, 100
    prepare_process()
    with bench_lock():
        from palace_dev.supervisor import Supervisor

        settings = bench_settings()
        sup = Supervisor(settings, services=[])
        t_start = time.perf_counter()
        try:
            with console.status("starting PostgreSQL and NATS ..."):
                stale = start_servers(sup)
            res = asyncio.run(run(args, settings, sup.database_url, sup.nats_url))
        finally:
            with console.status("stopping servers ..."):
                sup.stop()
    out = {"bench": "lifecycle", "config": vars(args), "stale_migrations": stale, **res,
           "wall_s": time.perf_counter() - t_start, "machine": machine_info()}
    path = write_results("lifecycle-quick" if args.quick else "lifecycle", out)
    total = args.drawers + args.forget_drawers
    t = Table(title=f"lifecycle jobs over {total:,} drawers, batch {settings.maintain_batch}, "
                    f"{out['machine']['cpus']} cores; search = hybrid recall SQL")
    for col in ("job", "seconds", "s per 100k", "changed", "HOT updates", "search p50/p99 alone",
                "search p50/p99 beside"):
        t.add_column(col, justify="left" if col == "job" else "right")
    for job, r in res["jobs"].items():
        a, b = r["search_alone_ms"], r["search_beside_ms"]
        hot = f"{r['hot_updates'] / r['row_updates']:.0%}" if r["row_updates"] else "-"
        t.add_row(job, f"{r['seconds']:.1f}", f"{r['seconds_per_100k']:.1f}", str(sum(r["counts"].values())), hot,
                  f"{a['p50']:.1f} / {a['p99']:.1f} ms", f"{b['p50']:.1f} / {b['p99']:.1f} ms")
    console.print(t)
    f = res["forget"]
    console.print(f"forget a user with {f['drawers']:,} drawers: {f['seconds']:.1f} s ({f['counts']})")
    console.print(f"results: {path}")


if __name__ == "__main__":
    main()
