"""Episodes in recall at scale: what `include_episodes` adds to a search, by how many built episodes the
workspace holds, and that the scan cap bounds it.

Each workspace is filled directly in PostgreSQL with built episodes shaped like enrich's (summary,
abstract, topics, an inline random embedding, a completion time), among ``--noise`` episodes of other
workspaces. Per size, ``--repeats`` calls of what ``Recaller.recall(..., episodes=3)`` adds after the
drawer ranking: ``search_episodes`` (k=3, the default cap) then ``session_drawers`` for the three
sessions (no drawers here: its cost is three index probes), each in its own workspace transaction, with
a fresh random query each time. Sizes at and past the cap (``EPISODE_SCAN_MAX``) show it holding; the
largest is measured again without the cap, alternating call by call with the capped one, for the
side-by-side ratio.

    .venv/bin/python bench/episodes.py [--sizes 1000,5000,30000] [--repeats 40]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid

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
from rich.table import Table

_FILL = """
INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, topics, status, embedding,
                      started_at, completed_at, promoted_at, announced_at)
SELECT %(ws)s, md5(%(ws)s || i), 'bench-' || i, 'a summary of session ' || i || ' about topic ' || (i %% 97),
       'session ' || i, ARRAY['topic-' || (i %% 97)], 'ready',
       (SELECT array_agg(random() - 0.5)::vector FROM generate_series(1, %(dim)s::int) WHERE i > 0),
       now() - i * interval '1 minute' - interval '30 minutes', now() - i * interval '1 minute', now(), now()
  FROM generate_series(%(a)s::int, %(b)s::int) i
"""


def _fill(url: str, ws: str, n: int, dim: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        for start in range(0, n, 5_000):
            admin.execute(_FILL, {"ws": ws, "dim": dim, "a": start + 1, "b": min(n, start + 5_000)})


async def run(sizes: list[int], repeats: int, noise: int) -> dict[str, object]:
    from palace_dev.supervisor import Supervisor
    from shared.db.episodes import EPISODE_SCAN_MAX, search_episodes, session_drawers
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    s = bench_settings()
    sup = Supervisor(s, services=[])
    await asyncio.to_thread(start_servers, sup)
    pool = await open_pool(sup.database_url, name="bench-episodes", max_size=2, role=s.db_role)
    run_id = uuid.uuid4().hex[:8]
    spaces = {n: f"bench-ep-{run_id}-{n}" for n in sizes}
    other = f"bench-ep-{run_id}-noise"
    rng = np.random.default_rng(7)
    out: dict[str, object] = {"scan_max": EPISODE_SCAN_MAX, "noise_episodes": noise, "sizes": {}}
    try:
        console.print(f"filling {sum(sizes) + noise:,} episodes ...")
        await asyncio.to_thread(_fill, sup.database_url, other, noise, s.embed_dim)
        for n, ws in spaces.items():
            await asyncio.to_thread(_fill, sup.database_url, ws, n, s.embed_dim)
        with psycopg.connect(sup.database_url, autocommit=True) as admin:
            admin.execute("VACUUM ANALYZE episodes")
        largest = max(sizes)
        for n, ws in spaces.items():
            ms: list[float] = []
            cpu: list[float] = []
            uncapped: list[float] = []
            for _ in range(repeats):
                q = rng.standard_normal(s.embed_dim).astype(np.float32)
                caps = [EPISODE_SCAN_MAX, n] if n == largest else [EPISODE_SCAN_MAX]
                for cap in caps:
                    t0, c0 = time.perf_counter(), time.process_time()
                    async with workspace_tx(pool, ws) as conn:
                        hits = await search_episodes(conn, ws, q, k=3, scan_max=cap)
                        await session_drawers(conn, ws, [h.session_id for h in hits], per_session=20)
                    took = (time.perf_counter() - t0) * 1000
                    if cap == EPISODE_SCAN_MAX:
                        ms.append(took)
                        cpu.append((time.process_time() - c0) * 1000)
                    else:
                        uncapped.append(took)
                    assert len(hits) == 3
            with psycopg.connect(sup.database_url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM episodes WHERE workspace_id = %s AND status = 'ready'"
                    " ORDER BY completed_at DESC NULLS LAST, id LIMIT %s) x", (ws, EPISODE_SCAN_MAX)).fetchone()
            out["sizes"][str(n)] = {"episodes": n, "scanned": row[0] if row else 0,  # type: ignore[index]
                                    "wall_ms": percentiles(ms), "client_cpu_ms": percentiles(cpu)}
            if uncapped:
                out["uncapped"] = {"episodes": n, "wall_ms": percentiles(uncapped),
                                   "p50_capped_over_uncapped": round(float(np.median(ms) / np.median(uncapped)), 3)}
        out["machine"] = machine_info()
        return out
    finally:
        with contextlib.suppress(Exception), psycopg.connect(sup.database_url, autocommit=True) as admin:
            admin.execute("DELETE FROM episodes WHERE workspace_id = ANY(%s)", ([*spaces.values(), other],))
        await pool.close()
        sup.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000,30000")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--noise", type=int, default=20_000, help="Episodes of another workspace.")
    args = ap.parse_args()
    prepare_process()
    with bench_lock():
        res = asyncio.run(run([int(x) for x in args.sizes.split(",")], args.repeats, args.noise))
    t = Table(title=f"include_episodes: the episode statements per search (scan cap {res['scan_max']:,})")
    for col in ("episodes in workspace", "scanned", "p50 ms", "p95 ms"):
        t.add_column(col, justify="right")
    for r in res["sizes"].values():  # type: ignore[attr-defined]
        t.add_row(f"{r['episodes']:,}", f"{r['scanned']:,}", f"{r['wall_ms']['p50']:.2f}", f"{r['wall_ms']['p95']:.2f}")
    u = res.get("uncapped")
    if u:
        t.add_row(f"{u['episodes']:,} (no cap)", f"{u['episodes']:,}", f"{u['wall_ms']['p50']:.2f}",  # type: ignore[index]
                  f"{u['wall_ms']['p95']:.2f}")  # type: ignore[index]
    console.print(t)
    console.print(f"results: {write_results('episodes', res)}")


if __name__ == "__main__":
    main()
