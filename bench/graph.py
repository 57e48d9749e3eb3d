"""Palace graph latency at scale: the taxonomy (wing → room counts) of a large workspace, uncached
and cached, and what one new drawer costs the next reader.

The workspace is filled directly in PostgreSQL with drawers shaped like the pipeline's: content,
an inline embedding (random: the heap is as wide as a real one, which is what the
aggregate has to read), spread over ``--wings`` wings of ``--rooms`` rooms with skewed sizes.
The workspace stays under no vector index of its own (none is built unless search asks for one),
so the fill pays only for the indexes the aggregate reads or maintains.
Three figures, each over ``--repeats`` calls, through ``PalaceGraph.taxonomy`` (what the MCP tools
call):

* cold    — a process that has never seen the workspace (a fresh cache each call): the GROUP BY;
* cached  — the same process again: one read of the layout version;
* changed — after a drawer is added (the trigger bumps the version): the GROUP BY once more.

    .venv/bin/python bench/graph.py [--drawers 100000] [--repeats 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

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
from rich.table import Table


async def _fill(pool: object, ws: str, n: int, wings: int, rooms: int, dim: int) -> float:
    from shared.db.tenancy import workspace_tx

    t0 = time.perf_counter()
    batch = 10_000
    for start in range(0, n, batch):
        async with workspace_tx(pool, ws) as conn:  # type: ignore[arg-type]
            await conn.execute(
                """
                INSERT INTO drawers (workspace_id, id, content, content_hash, embedding, wing, room, state)
                SELECT %(ws)s, md5(%(ws)s || i), 'memory number ' || i || ' about topic ' || (i %% 97),
                       md5('c' || i),
                       (SELECT array_agg(random() - 0.5)::vector FROM generate_series(1, %(dim)s::int) WHERE i > 0),
                       'wing-' || floor(%(wings)s * power(random(), 2))::int,
                       'room-' || floor(%(rooms)s * power(random(), 2))::int,
                       'processed'
                  FROM generate_series(%(a)s::int, %(b)s::int) i
                """,
                {"ws": ws, "dim": dim, "wings": wings, "rooms": rooms, "a": start + 1, "b": min(n, start + batch)},
            )
        console.print(f"  {min(n, start + batch):,} drawers", end="\r")
    return time.perf_counter() - t0


async def run(n: int, repeats: int, wings: int, rooms: int) -> dict[str, object]:
    from palace_dev.supervisor import Supervisor
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx
    from shared.palace_graph import PalaceGraph

    s = bench_settings()
    sup = Supervisor(s, services=[])
    await asyncio.to_thread(start_servers, sup)
    pool = await open_pool(sup.database_url, name="bench-graph", max_size=2, role=s.db_role)
    ws = f"bench-graph-{uuid.uuid4().hex[:8]}"
    try:
        console.print(f"filling {ws} with {n:,} drawers ...")
        fill_s = await _fill(pool, ws, n, wings, rooms, s.embed_dim)
        with psycopg.connect(sup.database_url, autocommit=True) as admin:
            admin.execute("VACUUM ANALYZE drawers")  # what autovacuum leaves a settled workspace in
        cold, cached, changed = [], [], []
        graph = PalaceGraph(pool)
        tax = await graph.taxonomy(ws)
        assert tax.total == n, (tax.total, n)
        for i in range(repeats):
            t0 = time.perf_counter()
            await PalaceGraph(pool).taxonomy(ws)
            cold.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await graph.taxonomy(ws)
            cached.append((time.perf_counter() - t0) * 1000)
            async with workspace_tx(pool, ws) as conn:
                await conn.execute(
                    "INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room)"
                    " VALUES (%s, md5(%s), 'one more', md5(%s), 'wing-0', 'room-0')",
                    (ws, f"extra{i}", f"extra{i}"))
            t0 = time.perf_counter()
            after = await graph.taxonomy(ws)
            changed.append((time.perf_counter() - t0) * 1000)
            assert after.total == n + i + 1, "the cache saw the new drawer"
        return {"drawers": n, "wings": len(tax.wings), "wing_rooms": sum(len(r) for r in tax.wings.values()),
                "fill_s": round(fill_s, 1), "cold_ms": percentiles(cold), "cached_ms": percentiles(cached),
                "changed_ms": percentiles(changed), "machine": machine_info()}
    finally:
        with contextlib.suppress(Exception):
            async with workspace_tx(pool, ws) as conn:
                await conn.execute("DELETE FROM drawers WHERE workspace_id = %s", (ws,))
                await conn.execute("DELETE FROM palace_graph_versions WHERE workspace_id = %s", (ws,))
        await pool.close()
        sup.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drawers", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--wings", type=int, default=20)
    ap.add_argument("--rooms", type=int, default=40)
    args = ap.parse_args()
    prepare_process()
    with bench_lock():
        res = asyncio.run(run(args.drawers, args.repeats, args.wings, args.rooms))
    t = Table(title=f"taxonomy of one workspace: {res['drawers']:,} drawers, {res['wings']} wings, "
                    f"{res['wing_rooms']} wing/room pairs")
    for col in ("", "p50 ms", "p95 ms", "p99 ms"):
        t.add_column(col, justify="right")
    for label, key in (("cold (GROUP BY)", "cold_ms"), ("cached (version read)", "cached_ms"),
                       ("after a new drawer", "changed_ms")):
        p = res[key]
        t.add_row(label, f"{p['p50']:.2f}", f"{p['p95']:.2f}", f"{p['p99']:.2f}")  # type: ignore[index]
    console.print(t)
    console.print(f"results: {write_results('graph', res)}")


if __name__ == "__main__":
    main()
