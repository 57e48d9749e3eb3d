"""Per-workspace HNSW indexes (migration 0019): requested by the stages that rank a workspace's nearest
neighbours (search and cluster) when it outgrows exact scans, built concurrently by maintain, used by
both once ready.

Why per workspace: pgvector 0.6 applies the ``workspace_id`` filter after its graph walk, so a shared
index returns mostly other tenants' neighbours. A partial index (``WHERE workspace_id = '…'``) walks one
tenant's graph only; search plans it with the workspace as a literal (an unnamed, one-shot statement),
which is what lets PostgreSQL match the partial index's predicate.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

__all__ = [
    "OLDEST_WAIT_SQL",
    "PARALLEL_BUILD_FIXED_IN",
    "WANTED_SQL",
    "build_serially_unless_fixed",
    "build_vector_index",
    "drop_vector_index",
    "index_name_for",
    "index_predicate",
    "oldest_wait_s",
    "recheck_after",
    "request_vector_index",
    "requeue_orphaned_builds",
    "vector_index_for",
    "vector_index_left",
    "vector_index_ready",
    "wanted_vector_indexes",
]


# pgvector's parallel HNSW build overflows a buffer from 0.6.0 up to 0.8.1 (CVE-2026-3172: it can read other
# relations' data or crash the server; a crashed parallel worker restarts every PostgreSQL process).
PARALLEL_BUILD_FIXED_IN = (0, 8, 2)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


async def build_serially_unless_fixed(conn: AsyncConnection[Any]) -> bool:
    """On the connection about to build an HNSW index, turn parallel workers off unless the server's
    pgvector has the parallel build fixed. Returns whether it did. The setting lasts for the session; the
    builders' connections are their own (maintain's is closed after the build, reembed's is an operator's)."""
    cur = await conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    row = await cur.fetchone()
    if row is not None and _version(str(row[0])) >= PARALLEL_BUILD_FIXED_IN:
        return False
    await conn.execute("SET max_parallel_maintenance_workers = 0")
    return True


def index_predicate(workspace_id: str) -> sql.Composed:
    """The rows of a workspace's HNSW index (see ``build_vector_index``; ``palace reembed`` builds the
    next space's index over the same rows)."""
    return sql.SQL("workspace_id = {} AND state <> 'merged' AND deleted_at IS NULL").format(sql.Literal(workspace_id))


# maintain's poll, every PALACE_VECTOR_INDEX_POLL_S, reads both from the partial index of migration 0049:
# how long the oldest request not built yet has waited (NULL: none), and the requests to build.
OLDEST_WAIT_SQL = ("SELECT extract(epoch FROM now() - min(requested_at))::float8 FROM vector_indexes"
                   " WHERE state IN ('wanted', 'building')")
WANTED_SQL = "SELECT workspace_id, index_name FROM vector_indexes WHERE state = 'wanted' ORDER BY requested_at LIMIT %s"


def recheck_after(drawers: int, ready: bool, min_drawers: int, settled_s: float, waiting_s: float) -> float:
    """How long a stage may reuse its answer to "is this workspace's index ready?". A settled answer
    (ready, or a workspace small enough to scan exactly) changes slowly: ``settled_s``. A workspace
    waiting for its index is asked about again after ``waiting_s`` (maintain's poll): each event or
    search until it switches pays an exact scan of a workspace past the size that asked for the index,
    and that wait used to last up to ``settled_s`` after the index was ready."""
    return waiting_s if drawers > min_drawers and not ready else settled_s


def index_name_for(workspace_id: str) -> str:
    """A stable, valid identifier for the workspace's index (workspace ids may hold ``.:@-``)."""
    return "drawers_hnsw_" + hashlib.sha256(workspace_id.encode()).hexdigest()[:20]


async def vector_index_ready(conn: AsyncConnection[Any], workspace_id: str) -> bool:
    cur = await conn.execute("SELECT state = 'ready' FROM vector_indexes WHERE workspace_id = %s", (workspace_id,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def vector_index_for(conn: AsyncConnection[Any], workspace_id: str, drawers: int, min_drawers: int) -> bool:
    """Whether the workspace's own index is ready; when it is not and the workspace holds more than
    ``min_drawers`` live drawers (``drawers``, counted up to past that), asks maintain for one. Every
    stage that ranks neighbours asks, not search alone: a workspace written to but never searched
    would otherwise be scanned exactly by cluster for every event, at a cost growing with it."""
    ready = await vector_index_ready(conn, workspace_id)
    if not ready and drawers > min_drawers:
        await request_vector_index(conn, workspace_id, drawers)
    return ready


async def request_vector_index(conn: AsyncConnection[Any], workspace_id: str, drawers: int) -> None:
    """Ask maintain for the workspace's index (once; a failed build is asked for again)."""
    await conn.execute(
        """INSERT INTO vector_indexes (workspace_id, index_name, drawers) VALUES (%s, %s, %s)
           ON CONFLICT (workspace_id) DO UPDATE SET state = 'wanted', drawers = EXCLUDED.drawers,
                                                    requested_at = now(), error = NULL
            WHERE vector_indexes.state = 'failed'""",
        (workspace_id, index_name_for(workspace_id), drawers),
    )


async def wanted_vector_indexes(conn: AsyncConnection[Any], limit: int = 10) -> list[tuple[str, str]]:
    """(workspace_id, index_name) waiting for a build, oldest request first (maintenance role)."""
    cur = await conn.execute(WANTED_SQL, (limit,))
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def oldest_wait_s(conn: AsyncConnection[Any]) -> float | None:
    """How long the oldest request not built yet has waited, in seconds (None: none waits)."""
    cur = await conn.execute(OLDEST_WAIT_SQL)
    row = await cur.fetchone()
    return float(row[0]) if row and row[0] is not None else None


async def requeue_orphaned_builds(conn: AsyncConnection[Any]) -> int:
    """Ask again for the indexes whose build is marked as running; call it holding the build lease, when
    no build can be running. Their half-built index, if any, is dropped by the next build."""
    cur = await conn.execute("UPDATE vector_indexes SET state = 'wanted' WHERE state = 'building'")
    return max(cur.rowcount, 0)


async def build_vector_index(database_url: str, workspace_id: str, index_name: str, *, m: int = 16,
                             ef_construction: int = 64) -> None:
    """Build the workspace's partial HNSW index without blocking writes (``CONCURRENTLY``: its own
    autocommit connection, as the login role that owns the table), then mark it ready. A build that
    fails leaves no invalid index behind and is recorded as failed, to be asked for again.

    The index holds the drawers a walk may return, live and not merged away (every statement that walks
    it says so, search and cluster). A graph insert is the dearest part of writing a drawer, and every
    update that is not HOT makes one for the row's new version if it is in the index: a merge, an
    archive or a forget made one for a row no walk wants. Indexes built before held the whole workspace;
    they keep working."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SET ROLE palace_maintenance")
        await conn.execute("UPDATE vector_indexes SET state = 'building' WHERE workspace_id = %s", (workspace_id,))
        await conn.execute("RESET ROLE")
        ddl = sql.SQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON drawers USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = {m}, ef_construction = {ef}) WHERE {where}"
        ).format(name=sql.Identifier(index_name), m=sql.Literal(m), ef=sql.Literal(ef_construction),
                 where=index_predicate(workspace_id))
        try:
            # A build cut short (its builder died) leaves an invalid index under the name, which
            # IF NOT EXISTS would keep.
            cur = await conn.execute("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                     (index_name,))
            row = await cur.fetchone()
            if row and row[0]:
                await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index_name)))
            await conn.execute("SET maintenance_work_mem = '256MB'")
            await build_serially_unless_fixed(conn)
            await conn.execute(ddl)
            cur = await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                                     (index_name,))
            row = await cur.fetchone()
            if not (row and row[0]):
                raise RuntimeError(f"index {index_name} was not built valid")
        except Exception as e:
            await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index_name)))
            await conn.execute("SET ROLE palace_maintenance")
            await conn.execute("UPDATE vector_indexes SET state = 'failed', error = %s WHERE workspace_id = %s",
                               (repr(e)[:500], workspace_id))
            raise
        await conn.execute("SET ROLE palace_maintenance")
        cur = await conn.execute("UPDATE vector_indexes SET state = 'ready', ready_at = now() WHERE workspace_id = %s"
                                 " RETURNING 1", (workspace_id,))
        if await cur.fetchone() is None:
            # The workspace was forgotten while this built (drop_vector_index removed the request and found
            # no index yet): the new index is of nobody's memory.
            await conn.execute("RESET ROLE")
            await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index_name)))


async def drop_vector_index(database_url: str, workspace_id: str) -> dict[str, int]:
    """Remove a forgotten workspace's request row and its partial HNSW index, built or half built
    (``CONCURRENTLY``: its own autocommit connection as the table's owner, like the build, so searches
    of other workspaces are never blocked). A build still running finishes first and the drop follows
    it; one that had not created its index yet sees its request gone and drops what it built.
    Returns how many rows and indexes went."""
    name = index_name_for(workspace_id)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SET ROLE palace_maintenance")
        cur = await conn.execute("DELETE FROM vector_indexes WHERE workspace_id = %s", (workspace_id,))
        rows = cur.rowcount
        await conn.execute("RESET ROLE")
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
        found = await cur.fetchone()
        await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    return {"vector_index_requests": max(rows, 0), "vector_indexes": int(bool(found and found[0]))}


async def vector_index_left(conn: AsyncConnection[Any], workspace_id: str) -> dict[str, int]:
    """What of a workspace's vector index exists: its request row and the index itself (for verify)."""
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM vector_indexes WHERE workspace_id = %s),"
        "       (SELECT count(*) FROM pg_class WHERE relname = %s AND relkind = 'i')",
        (workspace_id, index_name_for(workspace_id)))
    row = await cur.fetchone()
    assert row is not None
    return {"vector_index_requests": int(row[0]), "vector_indexes": int(row[1])}
