"""What the per-event statements that look for in-flight rows cost while a backlog waits, before and after
they were written to find their rows by key (docs/scale.md, "In-flight states").

A workspace of settled drawers (processed, in sessions of ten, each session's episode announced) is analysed
while nothing is in flight, as autovacuum last saw it. Then, in one transaction rolled back at the end (so
no analysis sees it), a backlog is filed: drawers still raw and episodes not yet announced, as while the
embed service is down or behind. Each statement runs as the services' role against the backlog, in its
former form and in today's, alternated (each first in every other round), p50 of ``--rounds`` calls each
(writes undone by a savepoint).

    .venv/bin/python bench/backlog_plans.py [--drawers 50000] [--backlogs 0,1000,10000,50000] [--rounds 15]

Prints a table of p50 milliseconds per backlog size; writes bench/results/backlog_plans.json.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import psycopg
from _common import (
    bench_servers,
    console,
    machine_info,
    own_database,
    percentiles,
    prepare_process,
    write_results,
)
from rich.table import Table

WS = "bench-backlog"

# The former forms of the statements that were rewritten, not only re-worded (9795797, c8ce8f5).
REWRITTEN_BEFORE = {
    "enrich: sessions awaiting": """SELECT DISTINCT e.session_id FROM drawer_sources ds
          JOIN episodes e ON e.workspace_id = ds.workspace_id AND e.session_id = ds.session_id
         WHERE ds.workspace_id = %(ws)s AND ds.drawer_id = ANY(%(ids)s) AND e.announced_at IS NULL""",
    "enrich: episode progress": """SELECT e.status, e.source_hash, e.announced_at IS NOT NULL,
          extract(epoch FROM now() - coalesce(e.pending_since, e.created_at)),
          (SELECT count(DISTINCT d.id) FROM drawer_sources ds
             JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
            WHERE ds.workspace_id = e.workspace_id AND ds.session_id = e.session_id AND d.deleted_at IS NULL),
          (SELECT count(DISTINCT d.id) FROM drawer_sources ds
             JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
            WHERE ds.workspace_id = e.workspace_id AND ds.session_id = e.session_id
              AND d.deleted_at IS NULL AND d.embedding IS NULL AND d.state = 'raw')
          FROM episodes e WHERE e.workspace_id = %(ws)s AND e.id = %(episode)s""",
}
_IN_FLIGHT_CASE = re.compile(r"CASE WHEN ((?:(?!CASE|THEN).)+) THEN true END(?:\s*--[^\n]*)?")


def plain(statement: str) -> str:
    """A statement with its in-flight test written back as the plain predicate it was before it became a
    CASE (docs/scale.md, "In-flight states"): the index of in-flight rows is a way in again."""
    out, n = _IN_FLIGHT_CASE.subn(r"\1", statement)
    assert n == 1, statement
    return out


def forms() -> dict[str, dict[str, str]]:
    """name → {"before": the former form, "after": the library's own statement}; ingest's is the lookup that
    ends its store statement (``shared.db.sessions._STORE_SQL``, whose inserts find every drawer there already)."""
    from shared.db.drawers import NOTE_FAILURE_SQL, SAVE_CLASSIFICATIONS_SQL
    from shared.db.episodes import AWAITING_EPISODE_SQL, EPISODE_PROGRESS_SQL
    from shared.db.sessions import _STORE_SQL

    after = {
        "ingest: stored already": _STORE_SQL.rsplit("UNION ALL", 1)[1],
        "embed: failure note": NOTE_FAILURE_SQL.replace("%s", "%({})s").format("reason", "ws", "ids"),
        "classify: batch": SAVE_CLASSIFICATIONS_SQL,
        "enrich: sessions awaiting": AWAITING_EPISODE_SQL,
        "enrich: episode progress": EPISODE_PROGRESS_SQL.replace("%s", "%({})s").format("ws", "episode"),
    }
    return {name: {"before": REWRITTEN_BEFORE.get(name) or plain(sql_), "after": sql_}
            for name, sql_ in after.items()}


def settle(url: str, drawers: int) -> None:
    """The settled workspace, analysed with nothing in flight."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state)
                        SELECT %s, md5(g::text), 'drawer ' || g, md5(g::text), 'processed'
                          FROM generate_series(1, %s) g""", (WS, drawers))
        conn.execute("""INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)
                        SELECT %s, md5(g::text), 's' || (g / 10), g %% 10 FROM generate_series(1, %s) g""",
                     (WS, drawers))
        conn.execute("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status, announced_at)
                        SELECT %s, 'e' || g, 's' || g, '', '', 'ready', now() FROM generate_series(0, %s) g""",
                     (WS, drawers // 10))
        for table in ("drawers", "drawer_sources", "episodes"):
            conn.execute(f"ANALYZE {table}")


def measure(url: str, backlog: int, rounds: int) -> dict[str, Any]:
    """p50 ms of each statement, before and after, with ``backlog`` raw drawers and as many sessions'
    episodes waiting (a tenth of them), in a transaction nobody else sees."""
    statements = forms()
    times: dict[str, dict[str, list[float]]] = {name: {"before": [], "after": []} for name in statements}
    with psycopg.connect(url) as conn:
        if backlog:
            conn.execute("""INSERT INTO drawers (workspace_id, id, content, content_hash, state, filed_at, updated_at)
                            SELECT %s, 'b' || g, 'waiting ' || g, md5('b' || g), 'raw', now(), now()
                              FROM generate_series(1, %s) g""", (WS, backlog))
            conn.execute("""INSERT INTO drawer_sources (workspace_id, drawer_id, session_id, seq)
                            SELECT %s, 'b' || g, 'b' || (g / 10), g %% 10 FROM generate_series(1, %s) g""",
                         (WS, backlog))
            conn.execute("""INSERT INTO episodes (workspace_id, id, session_id, summary, abstract, status,
                                                  pending_since)
                            SELECT %s, 'eb' || g, 'b' || g, '', '', 'pending', now()
                              FROM generate_series(0, %s) g""", (WS, backlog // 10))
            ids = [f"b{g}" for g in range(10, 20)]  # the session 'b1', still raw
            episode = "eb1"
        else:
            ids = [r[0] for r in conn.execute("SELECT md5(g::text) FROM generate_series(10, 19) g")]
            episode = "e1"
        params = {"ws": WS, "ids": ids, "episode": episode, "reason": "down", "min_imp": 3.0,
                  "types": ["fact"] * len(ids), "confs": [0.5] * len(ids), "imps": [2.0] * len(ids),
                  "tiers": ["heuristic"] * len(ids)}
        conn.execute("SET LOCAL ROLE palace_app")
        conn.execute("SELECT set_config('palace.workspace_id', %s, true)", (WS,))
        for r in range(rounds):
            for name in statements:
                for form in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    conn.execute("SAVEPOINT s")
                    t0 = time.perf_counter()
                    cur = conn.execute(statements[name][form], params, prepare=False)
                    if cur.description is not None:
                        cur.fetchall()
                    times[name][form].append((time.perf_counter() - t0) * 1000)
                    conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.rollback()
    return {"backlog": backlog, "statements": {name: {f: percentiles(v) for f, v in t.items()}
                                               for name, t in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drawers", type=int, default=50_000)
    ap.add_argument("--backlogs", default="0,1000,10000,50000")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    prepare_process()
    with bench_servers() as (sup, load), own_database(sup.database_url, "palace_backlog") as url:
        settle(url, args.drawers)
        runs = [measure(url, int(b), args.rounds) for b in args.backlogs.split(",")]
    t = Table(title=f"per-event statements while a backlog waits: p50 ms, before → after "
                    f"({args.drawers:,} settled drawers, analysed before the backlog)")
    t.add_column("statement")
    for r in runs:
        t.add_column(f"backlog {r['backlog']:,}", justify="right")
    for name in runs[0]["statements"]:
        t.add_row(name, *(f"{r['statements'][name]['before']['p50']:.2f} → {r['statements'][name]['after']['p50']:.2f}"
                          for r in runs))
    console.print(t)
    path = write_results("backlog_plans", {"bench": "backlog_plans", "config": vars(args), "runs": runs,
                                           "machine": {**machine_info(), "load_at_start": load}})
    console.print(f"results: {path}")
    last = runs[-1]
    p50 = {n: (f["before"]["p50"], f["after"]["p50"]) for n, f in last["statements"].items()}
    worst = max(p50, key=lambda n: p50[n][0] / p50[n][1])
    s = last["statements"][worst]
    print(f"backlog_plans backlog={last['backlog']} worst={worst.replace(' ', '_')} "
          f"before_p50_ms={s['before']['p50']:.2f} after_p50_ms={s['after']['p50']:.2f}")


if __name__ == "__main__":
    main()
