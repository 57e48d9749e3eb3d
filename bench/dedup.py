"""The near-duplicate check's cost per drawer as a workspace grows: 1k, 10k and 100k drawers.

Each workspace is filled by binary COPY with LoCoMo turns and noisy copies of them (real wording
bands, random-but-fixed embeddings), then the check cluster runs for a new drawer
(``shared.db.drawers.OLDER_TWINS_SQL``: wording-band candidates from the GIN index) is timed for
held-out near-verbatim variants, side by side with the exact scan it replaced (every embedding of the
workspace, nearest first) in the same run. The index path should stay flat; the scan grows.

    .venv/bin/python bench/dedup.py [--sizes 1000,10000,100000] [--queries 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from typing import Any

import numpy as np
import psycopg
from _common import (
    BENCH_STACK,
    bench_lock,
    bench_settings,
    console,
    load_locomo,
    machine_info,
    prepare_process,
    start_servers,
    write_results,
)
from pgvector.psycopg import register_vector
from rich.table import Table

from shared.db.drawers import OLDER_TWINS_SQL
from shared.ids import content_hash
from shared.memory.dedup import wording_bands

EXACT_SQL = """
    SELECT d.id, 1 - (d.embedding <=> %(emb)s) AS sim, d.content FROM drawers d
     WHERE d.workspace_id = %(ws)s AND d.id <> %(id)s AND d.state = 'processed' AND d.deleted_at IS NULL
       AND d.embedding IS NOT NULL
     ORDER BY (d.embedding <=> %(emb)s) + 0 LIMIT %(n)s
"""


def fill(conn: psycopg.Connection[Any], workspace: str, texts: list[str], size: int, dim: int,
         rng: random.Random) -> None:
    """``size`` drawers: LoCoMo turns, then copies with a lap marker (distinct wording, same vocabulary)."""
    nrng = np.random.default_rng(rng.randrange(2**32))
    with conn.cursor() as cur, cur.copy(
            "COPY drawers (workspace_id, id, content, content_hash, state, embedding, dedup_bands) "
            "FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["text", "text", "text", "text", "text", "vector", "int8[]"])
        for i in range(size):
            text = texts[i % len(texts)] + (f" (copy {i // len(texts)})" if i >= len(texts) else "")
            v = nrng.standard_normal(dim).astype(np.float32)
            h = content_hash(text)
            copy.write_row([workspace, h[:32], text, h, "processed", v / np.linalg.norm(v),
                            wording_bands(workspace, text)])


def time_queries(conn: psycopg.Connection[Any], sql: str, workspace: str, probes: list[tuple[str, np.ndarray]],
                 dim: int) -> list[float]:
    out = []
    for text, v in probes:
        params = {"ws": workspace, "id": "probe", "emb": v, "bands": wording_bands(workspace, text), "n": 5}
        t0 = time.perf_counter()
        conn.execute(sql, params, prepare=False).fetchall()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prepare_process()
    with bench_lock():
        _run(args)


def _run(args: argparse.Namespace) -> None:
    from palace_dev.supervisor import Supervisor

    settings = bench_settings()
    turns, _ = load_locomo()
    texts = [t.text for t in turns if len(t.text.split()) >= 6]
    rng = random.Random(args.seed)
    sup = Supervisor(settings, services=[], log_dir=BENCH_STACK / "logs")
    rows = []
    try:
        with console.status("starting PostgreSQL ..."):
            start_servers(sup)
        with psycopg.connect(sup.database_url, autocommit=True) as conn:
            register_vector(conn)
            conn.execute("SET ROLE palace_maintenance")  # the check's own statement runs as the service does
            for size in (int(s) for s in args.sizes.split(",")):
                ws = f"bench-dedup-{uuid.uuid4().hex[:6]}"
                with console.status(f"COPY {size:,} drawers into {ws} ..."):
                    conn.execute("RESET ROLE")
                    fill(conn, ws, texts, size, settings.embed_dim, rng)
                    conn.execute("ANALYZE drawers")
                    conn.execute("SET ROLE palace_maintenance")
                conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (ws,))
                picks = rng.sample(texts, min(args.queries, len(texts)))
                nrng = np.random.default_rng(size)
                probes = [(t.upper() + " !", (lambda v: v / np.linalg.norm(v))(
                    nrng.standard_normal(settings.embed_dim).astype(np.float32))) for t in picks]
                time_queries(conn, OLDER_TWINS_SQL, ws, probes[:10], settings.embed_dim)  # warm
                idx = time_queries(conn, OLDER_TWINS_SQL, ws, probes, settings.embed_dim)
                exact = time_queries(conn, EXACT_SQL, ws, probes, settings.embed_dim)
                rows.append({"drawers": size, "index_p50_ms": statistics.median(idx),
                             "index_p99_ms": float(np.percentile(idx, 99)),
                             "exact_scan_p50_ms": statistics.median(exact)})
                conn.execute("RESET ROLE")
                conn.execute("DELETE FROM drawers WHERE workspace_id = %s", (ws,))
    finally:
        sup.stop()
    out = {"bench": "dedup", "config": vars(args), "rows": rows, "machine": machine_info()}
    path = write_results("dedup", out)
    t = Table(title="near-duplicate check per drawer, ms (same run)")
    for col in ("drawers in workspace", "wording index p50", "p99", "exact scan p50 (before)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['drawers']:,}", f"{r['index_p50_ms']:.2f}", f"{r['index_p99_ms']:.2f}",
                  f"{r['exact_scan_p50_ms']:.2f}")
    console.print(t)
    console.print(f"results: {path.relative_to(path.parents[2])}")


if __name__ == "__main__":
    main()
