"""Planner statistics that do not go blind to a new workspace.

Every hot statement names its workspace, and PostgreSQL estimates ``workspace_id = 'w'`` from the
column's most-common-values list. Where that list covers every workspace the table held at its last
ANALYZE (a database with fewer than a hundred of them, which is most), a workspace that appeared
since is estimated at one row, however large it has grown. One row makes a scan of the whole
workspace look as cheap as a primary-key lookup: ``session_turns`` read every drawer of the workspace
for each turn of a session, and enrich's confidence update walked the workspace's facts once per
fact. Each call then costs in proportion to the workspace, until autovacuum analyzes the table, which
by default waits for a tenth of the table to change: a hundred thousand rows in a million.

So maintain looks, every few seconds, for the state that misleads the planner: a workspace holding at
least ``min_rows`` rows of a table that the planner estimates at fewer. Only then is the table analyzed
(its workspace column). The estimates come from the planner itself (``EXPLAIN``), not from ``pg_stats``,
which hides the statistics of a table under row-level security from every role but a superuser's. The
check is cheap where nothing is wrong: it looks only at tables that had ``min_rows`` rows written since
they were last analyzed in full (autovacuum's; this one's, of one column, leaves the count), and of
those only at tables where a workspace never seen would be estimated at fewer than ``min_rows`` (a list
that covers every workspace, so few of them: a skip scan of the primary key lists them); counting a
workspace's rows stops at ``min_rows``. A workspace once analyzed is in the list, with the size it had
then: it may grow past that, but it is no longer estimated as empty, which is what makes the plans go
wrong.

The workspace column alone is not enough where the other columns have no statistics at all: a new
database whose tables filled faster than autovacuum got to analyzing them (``stale_tables``). Such a table
is analyzed whole, once per doubling while it grows, and left to autovacuum once it keeps up.
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

__all__ = ["analyze_tables", "blind_tables", "estimated_rows", "stale_tables"]

# Tables with a workspace_id column and an index leading with it (the skip scan needs one), with the rows
# written since their last full ANALYZE (a workspace the statistics lack can only have grown among those).
_TABLES_SQL = """
SELECT c.relname, COALESCE(pg_stat_get_mod_since_analyze(c.oid), 0)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'workspace_id' AND NOT a.attisdropped
 WHERE c.relkind = 'r'
   AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indkey[0] = a.attnum)
   -- one row per workspace (unique on the column alone): no workspace can grow there
   AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique AND i.indnkeyatts = 1
                                             AND i.indkey[0] = a.attnum)
 ORDER BY c.relname
"""
# Tables changed, since their last full ANALYZE, by as many rows as they held then (``reltuples`` is -1 for a
# table never analyzed) and by at least ``min`` rows: ten times autovacuum's own trigger (a tenth of the
# table), so autovacuum has fallen behind on them. A column-only ANALYZE (``analyze_tables``) updates
# ``reltuples`` but leaves the count, so the count is always "since the last full one".
_STALE_SQL = """
SELECT c.relname
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
 WHERE c.relkind = 'r'
   AND COALESCE(pg_stat_get_mod_since_analyze(c.oid), 0) >= greatest(%s, c.reltuples)
 ORDER BY c.relname
"""
# No workspace is called this (ids are printable): what the planner expects of one it has never seen.
_NEVER_SEEN = "\x01palace-unseen"


async def estimated_rows(conn: AsyncConnection[Any], table: str, workspace_id: str) -> float:
    """The planner's estimate of ``table``'s rows in the workspace."""
    cur = await conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {t} WHERE workspace_id = {w}").format(
        t=sql.Identifier(table), w=sql.Literal(workspace_id)))
    row = await cur.fetchone()
    plan = row[0] if row else None
    if isinstance(plan, str):
        plan = json.loads(plan)
    return float(plan[0]["Plan"]["Plan Rows"]) if plan else 0.0


async def _workspaces(conn: AsyncConnection[Any], table: str, limit: int) -> list[str]:
    """The table's workspaces, one index descent each (a skip scan: the table may be large, its
    workspaces are few wherever this is asked)."""
    cur = await conn.execute(sql.SQL(
        """WITH RECURSIVE w(ws) AS (
               (SELECT workspace_id FROM {t} ORDER BY workspace_id LIMIT 1)
               UNION ALL
               SELECT (SELECT x.workspace_id FROM {t} x WHERE x.workspace_id > w.ws ORDER BY x.workspace_id LIMIT 1)
                 FROM w WHERE w.ws IS NOT NULL)
           SELECT ws FROM w WHERE ws IS NOT NULL LIMIT %s""").format(t=sql.Identifier(table)), (limit,))
    return [str(r[0]) for r in await cur.fetchall()]


async def _holding(conn: AsyncConnection[Any], table: str, workspaces: list[str], n: int) -> list[str]:
    """Those of ``workspaces`` with at least ``n`` rows in the table: one statement, each workspace's count
    stopping at ``n`` (an index-only range scan apiece)."""
    if not workspaces:
        return []
    cur = await conn.execute(sql.SQL(
        """SELECT w FROM unnest(%(ws)s::text[]) AS q(w)
            WHERE (SELECT count(*) FROM (SELECT 1 FROM {t} x WHERE x.workspace_id = q.w LIMIT %(n)s) c) >= %(n)s"""
    ).format(t=sql.Identifier(table)), {"ws": workspaces, "n": n})
    return [str(r[0]) for r in await cur.fetchall()]


async def blind_tables(conn: AsyncConnection[Any], min_rows: int, *, known: set[tuple[str, str]] | None = None,
                       max_workspaces: int = 500) -> dict[str, list[str]]:
    """Tables whose planner estimates a workspace holding at least ``min_rows`` rows at fewer, with those
    workspaces. Read under a role that sees every workspace (maintenance).

    ``known`` (kept by the caller between checks) holds the (table, workspace) pairs already estimated at
    ``min_rows`` or more: an ANALYZE keeps a workspace in the list while it has rows, so they are not
    asked again. A table with more than ``max_workspaces`` workspaces is passed over: its list (a hundred
    values by default) cannot hold them all, so one outside it is estimated from what the list leaves."""
    known = set() if known is None else known
    out: dict[str, list[str]] = {}
    cur = await conn.execute(_TABLES_SQL)
    for table, changed in await cur.fetchall():
        if int(changed) < min_rows or await estimated_rows(conn, table, _NEVER_SEEN) >= min_rows:
            continue
        workspaces = await _workspaces(conn, table, max_workspaces + 1)
        if len(workspaces) > max_workspaces:
            continue  # more than the list can hold: a workspace outside it is estimated from the rest
        blind = []
        for w in await _holding(conn, table, [w for w in workspaces if (table, w) not in known], min_rows):
            if await estimated_rows(conn, table, w) >= min_rows:
                known.add((table, w))
            else:
                blind.append(w)
        if blind:
            out[str(table)] = blind
    return out


async def stale_tables(conn: AsyncConnection[Any], min_rows: int) -> list[str]:
    """Tables autovacuum has not analyzed while they changed by as many rows as they held (and by at least
    ``min_rows``): their other columns have no statistics, or statistics of a table a fraction of today's.

    A new database is where this bites. Its tables fill from nothing, autovacuum's worker may spend minutes
    vacuuming a table with a vector index before it gets to analyzing it, and meanwhile a column without
    statistics is estimated by a default selectivity: ``state = 'processed'`` looks as selective as a primary
    key, and a lookup by id walks every processed drawer of the workspace instead. Read under a role that sees
    the statistics counters (maintenance)."""
    cur = await conn.execute(_STALE_SQL, (min_rows,))
    return [str(r[0]) for r in await cur.fetchall()]


# The columns of the table's extended statistics (CREATE STATISTICS, e.g. drawers_layout of migration 0059):
# PostgreSQL builds such an object only when ANALYZE covers all of its columns, and skips it otherwise.
_EXTENDED_COLUMNS_SQL = """
SELECT DISTINCT a.attname FROM pg_statistic_ext s
  JOIN pg_attribute a ON a.attrelid = s.stxrelid AND a.attnum = ANY(s.stxkeys::int2[])
 WHERE s.stxrelid = %s::regclass ORDER BY 1"""


async def analyze_tables(database_url: str, tables: list[str], *, whole: AbstractSet[str] = frozenset()
                         ) -> tuple[list[str], dict[str, str]]:
    """``ANALYZE`` each table's workspace column, or the whole table for those in ``whole`` (stale ones),
    as the login role that owns it, on a connection of its own (autocommit). The column alone where that
    is all that is missing: the statistics of a vector, a tsvector or an array column cost several times
    the sampling itself, and autovacuum keeps those on its own schedule. With it go the columns of the
    table's extended statistics: a new workspace is what they must see (its rooms' real size), and they are
    built only from an ANALYZE of all their columns. SKIP_LOCKED: a table locked by an index build is left
    for the next round rather than waited on. Returns the tables analyzed, and those skipped with
    PostgreSQL's reason (locked, or a login role that does not own it)."""
    done: list[str] = []
    skipped: dict[str, str] = {}
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for table in tables:
            why: list[str] = []

            def notice(d: psycopg.errors.Diagnostic, why: list[str] = why) -> None:
                if "skipping" in (d.message_primary or ""):
                    why.append(d.message_primary or "")

            columns = ["workspace_id"]
            if table not in whole:
                cur = await conn.execute(_EXTENDED_COLUMNS_SQL, (table,))
                columns += [str(r[0]) for r in await cur.fetchall() if r[0] != "workspace_id"]
            conn.add_notice_handler(notice)
            try:
                target = sql.Identifier(table) if table in whole else sql.SQL("{} ({})").format(
                    sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns)))
                await conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(target))
            finally:
                conn.remove_notice_handler(notice)
            if why:
                skipped[table] = why[0]
            else:
                done.append(table)
    return done, skipped
