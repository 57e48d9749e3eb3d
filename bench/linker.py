"""What the inline linker adds to ingest: time per session to link LoCoMo-dev's drawers to a workspace
that already holds every entity the pattern extractor finds in the whole file (the worst case for
a linker: each session is matched against the entities of all sessions, before and after it).

    .venv/bin/python bench/linker.py

Prints per-session latency (p50/p95 ms), time per drawer, distinct words probed and links made; writes
bench/results/linker.json.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import psycopg
from _common import (
    bench_servers,
    console,
    load_locomo,
    machine_info,
    percentiles,
    prepare_process,
    write_results,
)

WORKSPACE = "bench-linker"


async def run(database_url: str) -> dict[str, Any]:
    from shared.db.kg import ensure_entities, link_drawers
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx
    from shared.ids import content_hash, drawer_id
    from shared.memory.entities import extract_entities
    from shared.memory.kg import text_words

    turns, _ = load_locomo()
    sessions: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    speakers = tuple(sorted({t.speaker for t in turns}))
    names: dict[str, tuple[str, str]] = {}
    for t in turns:
        did = drawer_id(WORKSPACE, content_hash(t.text))
        sessions[(t.conv, t.session)].append((did, t.text))
        for name, etype in extract_entities(t.text, speakers):
            names.setdefault(name.casefold(), (name, etype))
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("DELETE FROM entities WHERE workspace_id = %s", (WORKSPACE,))
        admin.execute("DELETE FROM drawers WHERE workspace_id = %s", (WORKSPACE,))
        rows = list({d: (WORKSPACE, d, text, content_hash(text)) for s in sessions.values() for d, text in s}.values())
        with admin.cursor() as cur:
            cur.executemany("INSERT INTO drawers (workspace_id, id, content, content_hash) VALUES (%s, %s, %s, %s)"
                            " ON CONFLICT DO NOTHING", rows)
    pool = await open_pool(database_url, name="bench-linker", max_size=1)
    try:
        async with workspace_tx(pool, WORKSPACE) as conn:
            await ensure_entities(conn, WORKSPACE, list(names.values()))
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("ANALYZE entity_aliases")
            admin.execute("ANALYZE entity_mentions")
        ms: list[float] = []
        links = probes = drawers = 0
        for batch in sessions.values():
            t0 = time.perf_counter()
            async with workspace_tx(pool, WORKSPACE) as conn:
                res = await link_drawers(conn, WORKSPACE, batch)
            ms.append((time.perf_counter() - t0) * 1000)
            links += res.new_mentions
            drawers += len(batch)
            probes += len({w for _, text in batch for w in text_words(text).words})
    finally:
        await pool.close()
    return {"entities": len(names), "sessions": len(sessions), "drawers": drawers, "links": links,
            "probed_keys_per_session": probes / len(sessions), "session_ms": percentiles(ms),
            "ms_per_drawer": sum(ms) / drawers}


def main() -> None:
    prepare_process()
    with bench_servers() as (sup, load):
        res = asyncio.run(run(sup.database_url))
    res["machine"] = {**machine_info(), "load_at_start": load}
    s = res["session_ms"]
    console.print(f"{res['entities']} entities; {res['sessions']} sessions, {res['drawers']} drawers; "
                  f"{res['links']} links ({res['links'] / res['drawers']:.2f} a drawer)")
    console.print(f"link a session: p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms; {res['ms_per_drawer']:.2f} ms a "
                  f"drawer; {res['probed_keys_per_session']:.0f} distinct words probed a session")
    write_results("linker", res)


if __name__ == "__main__":
    main()
