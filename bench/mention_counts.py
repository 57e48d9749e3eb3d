"""What keeping an entity's mention count and confidence up to date costs as the entity is named more
often: ``refresh_entities`` (after each extraction: consumes the entity's pending change rows, migration
0051) against ``recount_entities`` (counts every mention again: what every refresh did before, and what
merges, reverts and forgets still do), side by side for entities of 10 to 100,000 mentions, as the
services' role. Each round adds one mention (as an extraction does) and then times the statement(s).

    .venv/bin/python bench/mention_counts.py [--sizes 10,1000,10000,100000] [--rounds 30]

Prints a table of p50 milliseconds per size; writes bench/results/mention_counts.json.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import psycopg
from _common import (
    bench_servers,
    cleanup_workspace,
    console,
    machine_info,
    percentiles,
    prepare_process,
    write_results,
)
from rich.table import Table


async def measure(database_url: str, size: int, rounds: int) -> dict[str, Any]:
    from shared.db.kg import recount_entities, refresh_entities
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx
    from shared.memory.kg import entity_id

    ws = f"bench-mentions-{size}"
    eid = entity_id(ws, "Ada")
    await cleanup_workspace(database_url, ws)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("INSERT INTO entities (workspace_id, id, name, entity_type) VALUES (%s, %s, 'Ada', 'person')",
                      (ws, eid))
        admin.execute(
            """INSERT INTO drawers (workspace_id, id, content, content_hash)
               SELECT %s, 'd' || i, 'Ada, turn ' || i, md5(%s || i) FROM generate_series(1, %s) i""",
            (ws, ws, size + rounds))
        admin.execute(
            """INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)
               SELECT %s, %s, 'd' || i, 0.8 FROM generate_series(1, %s) i""", (ws, eid, size))
        for t in ("drawers", "entities", "entity_mentions", "entity_mention_changes"):
            admin.execute(f"ANALYZE {t}")
    pool = await open_pool(database_url, name="bench-mentions", max_size=1)
    refresh: list[float] = []
    recount: list[float] = []
    try:
        async with workspace_tx(pool, ws) as conn:
            await refresh_entities(conn, ws, [eid])
        for r in range(rounds):
            async with workspace_tx(pool, ws) as conn:
                await conn.execute("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)"
                                   " VALUES (%s, %s, %s, 0.5)", (ws, eid, f"d{size + r + 1}"))
            t0 = time.perf_counter()
            async with workspace_tx(pool, ws) as conn:
                await refresh_entities(conn, ws, [eid])
            refresh.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            async with workspace_tx(pool, ws) as conn:
                await recount_entities(conn, ws, [eid])
            recount.append((time.perf_counter() - t0) * 1000)
        async with workspace_tx(pool, ws) as conn:
            cur = await conn.execute("SELECT mention_count FROM entities WHERE workspace_id = %s AND id = %s",
                                     (ws, eid))
            row = await cur.fetchone()
    finally:
        await pool.close()
        await cleanup_workspace(database_url, ws)
    assert row is not None and row[0] == size + rounds, (row, size + rounds)
    return {"mentions": size, "refresh_ms": percentiles(refresh), "recount_ms": percentiles(recount)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,1000,10000,100000")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    prepare_process()
    with bench_servers() as (sup, load):
        runs = [asyncio.run(measure(sup.database_url, int(n), args.rounds)) for n in args.sizes.split(",")]
    t = Table(title="keeping one entity's mention count: p50 ms per refresh, each in its own transaction")
    for col in ("mentions", "refresh (changes)", "recount (all mentions)", "recount / refresh"):
        t.add_column(col, justify="right")
    for r in runs:
        a, b = r["refresh_ms"]["p50"], r["recount_ms"]["p50"]
        t.add_row(f"{r['mentions']:,}", f"{a:.2f}", f"{b:.2f}", f"{b / a:.1f}×")
    console.print(t)
    path = write_results("mention_counts", {"bench": "mention_counts", "config": vars(args), "runs": runs,
                                            "machine": {**machine_info(), "load_at_start": load}})
    console.print(f"results: {path}")
    last = runs[-1]
    print(f"mention_counts mentions={last['mentions']} refresh_p50_ms={last['refresh_ms']['p50']:.2f} "
          f"recount_p50_ms={last['recount_ms']['p50']:.2f}")


if __name__ == "__main__":
    main()
