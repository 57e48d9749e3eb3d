"""Graph-boosted recall, the database part: the drawers a query reaches through the knowledge graph.

One statement, every step an index probe: the query's word runs against ``entity_aliases`` by key
(its primary key), one hop through ``triples`` in both directions (``triples_subject_from``,
``triples_object_from``), then ``entity_mentions`` by entity (its primary key), with each entity's
mention count capped at ``max_df + 1`` so a speaker named in thousands of drawers costs no more than
a rare name. shared/memory/graph_signal.py turns the rows into strengths.

It can never break or slow a search past its budget: it runs inside a savepoint with its own
``statement_timeout``; on a timeout or any database error the savepoint is rolled back (which also
restores the transaction's own timeout) and the search goes on without the graph. The signal is
additive: without it every other signal scores as before.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import psycopg
from psycopg import AsyncConnection
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from shared.logging import get_logger
from shared.memory.graph_signal import GraphParams, QueryNames, graph_strengths, query_names
from shared.metrics import SEARCH_SECONDS

__all__ = ["EXECUTE", "NOTE_TIMEOUT", "PREPARED_NAME", "graph_candidates", "graph_params", "graph_rows",
           "prepare_statement"]

log = get_logger("palace.recall.graph")

_SQL = """
WITH named AS (
    SELECT DISTINCT a.entity_id AS e FROM entity_aliases a
     WHERE a.workspace_id = %(ws)s
       AND (a.alias_key = ANY(%(any)s::text[]) OR (a.alias_key = ANY(%(uncased)s::text[]) AND NOT a.cased))
     LIMIT %(max_entities)s
), hop AS (
    SELECT DISTINCT x.e FROM (
        SELECT t.object_id AS e FROM named n
          JOIN triples t ON t.workspace_id = %(ws)s AND t.subject_id = n.e
        UNION ALL
        SELECT t.subject_id FROM named n
          JOIN triples t ON t.workspace_id = %(ws)s AND t.object_id = n.e
    ) x
     WHERE x.e NOT IN (SELECT e FROM named)
     LIMIT %(max_hops)s
), reached AS (
    SELECT e, 0 AS hops FROM named UNION ALL SELECT e, 1 FROM hop
), counted AS MATERIALIZED (  -- each count once, not once per mention joined below
    SELECT r.e, r.hops,
           (SELECT count(*) FROM (SELECT 1 FROM entity_mentions m
                                   WHERE m.workspace_id = %(ws)s AND m.entity_id = r.e
                                   LIMIT %(max_df)s + 1) z) AS df
      FROM reached r
), found AS MATERIALIZED (
    SELECT m.drawer_id, c.e, c.hops, c.df,
           -- graph_strengths' formula (shared/memory/graph_signal.py), to choose the strongest here
           least(greatest(ln(%(n)s::float8 / c.df) / ln(%(n)s::float8), 0), 1)
             * CASE WHEN c.hops = 0 THEN 1.0::float8 ELSE %(hop_factor)s::float8 END AS s
      FROM counted c
      JOIN entity_mentions m ON m.workspace_id = %(ws)s AND m.entity_id = c.e
     WHERE c.df <= %(max_df)s
), best AS MATERIALIZED (  -- the max_drawers strongest drawers, ties by id in code-point order, as there
    SELECT f.drawer_id FROM found f GROUP BY f.drawer_id HAVING max(f.s) > 0
     ORDER BY max(f.s) DESC, f.drawer_id COLLATE "C" LIMIT %(max_drawers)s
)
SELECT f.drawer_id, f.e, f.hops, f.df FROM found f WHERE f.drawer_id IN (SELECT drawer_id FROM best)
UNION ALL  -- last, once: hand the chosen drawers to the candidate statement (shared/db/search.py), and put
           -- the transaction's own timeout back for the statements after this one
SELECT NULL, set_config('palace.graph_ids', (SELECT coalesce(array_agg(drawer_id), '{}') FROM best)::text, true)
             || set_config('statement_timeout', current_setting('palace.graph_restore'), true), -1, 0
"""


# The lookup as a server-side prepared statement, for search's one-string round trip (shared/db/search.py):
# a string of statements is planned anew each time, and planning this one costs several times running it,
# inside its short deadline. Prepared once per connection (the name follows the text, so a new version
# of it gets a statement of its own).
_TYPES = (("ws", "text"), ("any", "text[]"), ("uncased", "text[]"), ("max_entities", "int"), ("max_hops", "int"),
          ("max_df", "int"), ("n", "float8"), ("hop_factor", "float8"), ("max_drawers", "int"))
PREPARED_NAME = "palace_graph_" + hashlib.sha256(_SQL.encode()).hexdigest()[:12]


def prepare_statement() -> str:
    """``PREPARE`` of the lookup (no parameters of its own: it is sent as it is)."""
    text = _SQL
    for i, (name, _) in enumerate(_TYPES, 1):
        text = text.replace(f"%({name})s", f"${i}")
    assert "%(" not in text
    return f"PREPARE {PREPARED_NAME} ({', '.join(t for _, t in _TYPES)}) AS {text}"


# Runs the prepared lookup; its parameters are ``graph_params``'.
EXECUTE = f"EXECUTE {PREPARED_NAME} ({', '.join(f'%({name})s' for name, _ in _TYPES)})"


def graph_params(workspace_id: str, names: QueryNames, workspace_drawers: int, p: GraphParams) -> dict[str, Any]:
    """The parameters of ``_SQL`` (and of the statement that notes the timeout to restore, ``NOTE_TIMEOUT``)."""
    return {"ws": workspace_id, "any": list(names.any_alias), "uncased": list(names.uncased_only),
            "max_entities": p.max_entities, "max_hops": p.max_hops, "max_df": p.max_df,
            "n": max(workspace_drawers, 2), "hop_factor": p.hop_factor, "max_drawers": p.max_drawers}


# Before the lookup, in its transaction: the timeout the lookup puts back as its last act, and no drawers yet.
NOTE_TIMEOUT = ("SELECT set_config('palace.graph_restore', current_setting('statement_timeout'), true),"
                " set_config('palace.graph_ids', '{}', true)")


def graph_rows(rows: list[tuple[Any, ...]]) -> list[tuple[str, str, int, int]]:
    """The lookup's rows without its closing one."""
    return [(str(d), str(e), int(h), int(df)) for d, e, h, df in rows if h >= 0]


async def _close_savepoint(conn: AsyncConnection[Any]) -> None:
    """Roll back to the savepoint (undoing the deadline with it) and release it, in one round trip.

    Both run under the short deadline still, and on a loaded machine a backend descheduled for longer
    than it has them cancelled too. Until the release went through the savepoint exists, and rolling
    back to it also clears an aborted transaction, so the pair is repeated a few times until it did."""
    async for attempt in AsyncRetrying(retry=retry_if_exception_type(psycopg.errors.QueryCanceled),
                                       stop=stop_after_attempt(5), reraise=True):
        with attempt:
            await conn.execute("ROLLBACK TO SAVEPOINT palace_graph; RELEASE SAVEPOINT palace_graph")


async def graph_candidates(conn: AsyncConnection[Any], workspace_id: str, query: str, workspace_drawers: int,
                           p: GraphParams = GraphParams()) -> dict[str, float]:
    """Drawer id → 0–1 graph strength for ``query`` (empty when the query names no known entity, the
    deadline passed, or the lookup failed). ``conn`` is inside the workspace's transaction.

    The lookup on its own, for callers other than search (which sends it in its own round trip,
    shared/db/search.py); it also leaves the chosen drawers in ``palace.graph_ids`` for the transaction."""
    names = query_names(query, p.max_words)
    if not names or p.timeout_ms <= 0:
        return {}
    t0 = time.perf_counter()
    # Two round trips when it works: one notes the transaction's timeout, opens a savepoint and sets the
    # deadline; the lookup itself puts the noted timeout back as its last act (the savepoint stays open
    # until the transaction ends, which costs nothing). Only a failed lookup needs a third, the rollback
    # to the savepoint, which undoes the deadline with everything else.
    await conn.execute(f"{NOTE_TIMEOUT}; SAVEPOINT palace_graph; SET LOCAL statement_timeout = {int(p.timeout_ms)}")
    rows: list[tuple[str, str, int, int]] = []
    try:
        cur = await conn.execute(_SQL, graph_params(workspace_id, names, workspace_drawers, p))
        rows = graph_rows(await cur.fetchall())
    except psycopg.errors.QueryCanceled:
        log.info("graph_recall_deadline", timeout_ms=p.timeout_ms)
        SEARCH_SECONDS.labels("graph_timeout").observe(time.perf_counter() - t0)
        await _close_savepoint(conn)
    except psycopg.DatabaseError as e:  # a search must not fail for its graph signal
        log.warning("graph_recall_failed", error=repr(e)[:300])
        await _close_savepoint(conn)
    SEARCH_SECONDS.labels("graph").observe(time.perf_counter() - t0)
    return graph_strengths(rows, workspace_drawers, p)
