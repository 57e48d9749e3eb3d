"""Embedding spaces (migration 0032): the active space services embed in, and the SQL of a re-embed.

A re-embed builds the new space in ``embedding_next`` columns beside ``embedding`` (drawers, episodes,
entities), with a partial index of the rows still to do and triggers that send a row back to that list
when its active-space vector changes. The switch is one short transaction under table locks: it
re-checks that nothing is left, then renames columns and indexes, so every statement that names
``embedding`` reads the new space from its commit on and no query text changes. The old space stays
in ``embedding_old`` until it is dropped explicitly.

DDL runs as the login role that owns the tables; row reads and writes under ``palace_maintenance``
(row-level security is forced for everyone else), each batch in its own short transaction.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg import AsyncConnection, sql

from shared.db.vector_indexes import build_serially_unless_fixed, index_name_for, index_predicate

__all__ = [
    "TABLES",
    "Space",
    "SpaceTarget",
    "abandon_space",
    "active_space",
    "build_next_index",
    "building_space",
    "cached_vectors",
    "drawers_todo",
    "drop_old_space", "drop_todo_index",
    "entities_todo",
    "episode_vectors",
    "episodes_todo",
    "old_space_exists",
    "ready_index_workspaces",
    "save_drawer_vectors",
    "save_vectors",
    "space_switched",
    "start_space",
    "switch_space",
    "todo_counts", "unsettled_drawers",
]

TABLES = ("drawers", "episodes", "entities")
# Per table, the rows still to do: every backfill batch and the switch's final check (under its locks) read
# an index, not the table (without one, each batch of episodes or entities walked every row already done).
_TODO_INDEX = {t: f"{t}_reembed_todo" for t in TABLES}
_TRIGGER = "palace_embedding_next_stale"
# What makes a row's new-space vector stale while the space builds: its active-space vector, or the
# text that vector was made from, changed.
_STALE_WHEN = {
    "drawers": "NEW.embedding IS DISTINCT FROM OLD.embedding OR NEW.content IS DISTINCT FROM OLD.content"
               " OR NEW.context IS DISTINCT FROM OLD.context OR NEW.speaker IS DISTINCT FROM OLD.speaker",
    "episodes": "NEW.embedding IS DISTINCT FROM OLD.embedding",
    "entities": "NEW.embedding IS DISTINCT FROM OLD.embedding OR NEW.name IS DISTINCT FROM OLD.name",
}


@dataclass(frozen=True)
class SpaceTarget:
    """The embedder a space is made with (its API key stays in the settings, never in the database)."""

    provider: str
    model: str
    dim: int
    base_url: str | None = None


@dataclass(frozen=True)
class Space:
    id: str
    provider: str | None  # None: the first space, made with whatever PALACE_EMBED_* configure
    model: str | None
    base_url: str | None
    dim: int
    state: str

    @property
    def target(self) -> SpaceTarget | None:
        if self.provider is None or self.model is None:
            return None
        return SpaceTarget(self.provider, self.model, self.dim, self.base_url)


_COLS = "id, provider, model, base_url, dim, state"


async def _one(conn: AsyncConnection[Any], where: str) -> Space | None:
    cur = await conn.execute(f"SELECT {_COLS} FROM embedding_spaces WHERE {where}")  # noqa: S608 - constant
    row = await cur.fetchone()
    return Space(*row) if row else None


async def active_space(conn: AsyncConnection[Any]) -> Space | None:
    """The space whose vectors are in the ``embedding`` columns (None before migration 0032)."""
    return await _one(conn, "state = 'active'")


async def space_switched(conn: AsyncConnection[Any], space_id: str | None) -> bool:
    """Whether the active space is no longer ``space_id`` (None: not known, never switched). Asked in the
    transaction that saved the vectors, after the save: the switch locks ``drawers`` exclusively, so either
    it committed before the save (and this statement sees the new space) or it waits for this commit and
    takes the saved vectors along as former-space ones."""
    if space_id is None:
        return False
    active = await active_space(conn)
    return active is not None and active.id != space_id


async def building_space(conn: AsyncConnection[Any]) -> Space | None:
    return await _one(conn, "state = 'building'")


async def _columns(conn: AsyncConnection[Any], table: str) -> dict[str, str]:
    cur = await conn.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
            WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
              AND a.attname LIKE 'embedding%%'""", (table,))
    return {r[0]: r[1] for r in await cur.fetchall()}


async def old_space_exists(conn: AsyncConnection[Any]) -> bool:
    return "embedding_old" in await _columns(conn, "drawers")


async def start_space(conn: AsyncConnection[Any], target: SpaceTarget) -> Space:
    """Create the building space (or resume the one that matches ``target``) and everything its backfill
    needs: the columns, the triggers, the to-do index. Idempotent, so a crashed re-embed resumes.

    ``conn`` is an autocommit connection of the login role (DDL, ``CREATE INDEX CONCURRENTLY``).
    """
    space = await building_space(conn)
    if space is not None and space.target != target:
        raise ValueError(f"a re-embed into {space.model} ({space.dim} dimensions) is in progress; finish it or "
                         "abandon it (palace reembed --abort) first")
    if space is None:
        await conn.execute("SET ROLE palace_maintenance")
        try:
            await conn.execute(
                "INSERT INTO embedding_spaces (id, provider, model, base_url, dim, state)"
                " VALUES (%s, %s, %s, %s, %s, 'building')",
                (uuid.uuid4().hex[:12], target.provider, target.model, target.base_url, target.dim))
        finally:
            await conn.execute("RESET ROLE")
        space = await building_space(conn)
        assert space is not None
    want = f"vector({target.dim})"
    for table in TABLES:
        have = (await _columns(conn, table)).get("embedding_next")
        if have is not None and have != want:  # left by an abandoned re-embed of another dimension
            await conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN embedding_next").format(sql.Identifier(table)))
            have = None
        if have is None:
            await conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN embedding_next vector({})").format(
                sql.Identifier(table), sql.Literal(target.dim)))
            if table == "drawers":  # inline in the heap row like `embedding` (migration 0005)
                await conn.execute("ALTER TABLE drawers ALTER COLUMN embedding_next SET STORAGE MAIN")
        await conn.execute(sql.SQL(
            "CREATE OR REPLACE TRIGGER {trg} BEFORE UPDATE ON {t} FOR EACH ROW WHEN ({when})"
            " EXECUTE FUNCTION palace_embedding_next_stale()").format(
            trg=sql.Identifier(_TRIGGER), t=sql.Identifier(table), when=sql.SQL(_STALE_WHEN[table])))
    # The rows still to do, so every batch and the switch's final check read an index, not the table.
    for table, index in _TODO_INDEX.items():
        await conn.execute(sql.SQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} (workspace_id, id)"
            " WHERE embedding IS NOT NULL AND embedding_next IS NULL").format(sql.Identifier(index),
                                                                            sql.Identifier(table)))
        cur = await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (index,))
        row = await cur.fetchone()
        if not (row and row[0]):  # an interrupted concurrent build leaves an invalid index: build it again
            await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index)))
            return await start_space(conn, target)
    return space


async def abandon_space(conn: AsyncConnection[Any]) -> bool:
    """Drop a building space and its columns (autocommit, login role); False when none was building."""
    space = await building_space(conn)
    await _drop_build_objects(conn)
    for table in TABLES:
        await conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS embedding_next").format(
            sql.Identifier(table)))
    if space is None:
        return False
    await conn.execute("SET ROLE palace_maintenance")
    try:
        await conn.execute("DELETE FROM embedding_spaces WHERE id = %s AND state = 'building'", (space.id,))
    finally:
        await conn.execute("RESET ROLE")
    return True


async def _drop_build_objects(conn: AsyncConnection[Any]) -> None:
    for table in TABLES:
        await conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(_TRIGGER),
                                                                            sql.Identifier(table)))
    for index in _TODO_INDEX.values():
        await conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index)))


async def todo_counts(conn: AsyncConnection[Any]) -> dict[str, int]:
    """Rows with an active-space vector and no new-space one yet, per table."""
    out = {}
    for table in TABLES:
        cur = await conn.execute(sql.SQL(
            "SELECT count(*) FROM {} WHERE embedding IS NOT NULL AND embedding_next IS NULL").format(
            sql.Identifier(table)))
        row = await cur.fetchone()
        out[table] = int(row[0]) if row else 0
    return out


async def drawers_todo(conn: AsyncConnection[Any], limit: int) -> list[tuple[str, str, str, str, str | None,
                                                                               str | None]]:
    """(workspace_id, id, content_hash, content, speaker, context) of drawers still to do (the to-do index)."""
    cur = await conn.execute(
        """SELECT workspace_id, id, content_hash, content, speaker, context FROM drawers
            WHERE embedding IS NOT NULL AND embedding_next IS NULL ORDER BY workspace_id, id LIMIT %s""", (limit,))
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def cached_vectors(conn: AsyncConnection[Any], model: str, keys: list[tuple[str, str]]) -> dict[
        tuple[str, str], np.ndarray]:
    """Cached vectors of ``model`` by (workspace_id, hash of the embedded text)."""
    if not keys:
        return {}
    cur = await conn.execute(
        """SELECT c.workspace_id, c.content_hash, c.embedding FROM embedding_cache c
             JOIN unnest(%s::text[], %s::text[]) AS k(ws, h) ON c.workspace_id = k.ws AND c.content_hash = k.h
            WHERE c.model = %s""", ([k[0] for k in keys], [k[1] for k in keys], model))
    from shared.db.drawers import as_array

    return {(r[0], r[1]): as_array(r[2]) for r in await cur.fetchall()}


async def save_drawer_vectors(conn: AsyncConnection[Any], model: str, rows: list[tuple[
        str, str, str, str | None, str, np.ndarray]], *, cache: bool = True) -> int:
    """Write new-space vectors: rows are (workspace_id, id, content_hash, context, text hash, vector).

    A drawer whose text changed since it was read is left alone (it is still to do, with its new text).
    ``embedding_model`` names the model of the row's newest vector.
    """
    if not rows:
        return 0
    updated: set[tuple[str, str]] = set()
    async with conn.cursor() as cur:
        # executemany runs in one pipeline: a batch costs a round trip, not one per drawer.
        await cur.executemany(
            """UPDATE drawers SET embedding_next = %s, embedding_model = %s
                WHERE workspace_id = %s AND id = %s AND embedding IS NOT NULL AND content_hash = %s
                  AND context IS NOT DISTINCT FROM %s RETURNING workspace_id, id""",
            [(vec, model, ws, did, chash, context) for ws, did, chash, context, _, vec in rows], returning=True)
        while True:
            row = await cur.fetchone()
            if row:
                updated.add((row[0], row[1]))
            if not cur.nextset():
                break
        if cache and updated:
            await cur.executemany(
                "INSERT INTO embedding_cache (workspace_id, model, content_hash, embedding) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(ws, model, thash, vec) for ws, did, _, _, thash, vec in rows if (ws, did) in updated])
    return len(updated)


async def episodes_todo(conn: AsyncConnection[Any], limit: int) -> list[tuple[str, str, str, str]]:
    """(workspace_id, id, session_id, summary) of episodes still to do."""
    cur = await conn.execute(
        """SELECT workspace_id, id, session_id, summary FROM episodes
            WHERE embedding IS NOT NULL AND embedding_next IS NULL ORDER BY workspace_id, id LIMIT %s""", (limit,))
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def episode_vectors(conn: AsyncConnection[Any], workspace_id: str, session_id: str) -> list[np.ndarray]:
    """New-space vectors of the session's live drawers: an episode is their mean (shared.memory.episodes)."""
    from shared.db.drawers import as_array

    cur = await conn.execute(
        """SELECT d.embedding_next FROM drawer_sources ds
             JOIN drawers d ON d.workspace_id = ds.workspace_id AND d.id = ds.drawer_id
            WHERE ds.workspace_id = %s AND ds.session_id = %s AND ds.revision IS NULL AND d.deleted_at IS NULL
              AND d.embedding_next IS NOT NULL
            ORDER BY ds.seq, ds.chunk_index""", (workspace_id, session_id))
    return [as_array(r[0]) for r in await cur.fetchall()]


async def entities_todo(conn: AsyncConnection[Any], limit: int) -> list[tuple[str, str, str]]:
    """(workspace_id, id, name) of entities still to do."""
    cur = await conn.execute(
        """SELECT workspace_id, id, name FROM entities
            WHERE embedding IS NOT NULL AND embedding_next IS NULL ORDER BY workspace_id, id LIMIT %s""", (limit,))
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def save_vectors(conn: AsyncConnection[Any], table: str, rows: list[tuple[str, str, np.ndarray]]) -> int:
    """New-space vectors of episodes or entities: rows are (workspace_id, id, vector)."""
    assert table in ("episodes", "entities")
    if not rows:
        return 0
    async with conn.cursor() as cur:
        await cur.executemany(sql.SQL(
            "UPDATE {} SET embedding_next = %s WHERE workspace_id = %s AND id = %s AND embedding IS NOT NULL"
        ).format(sql.Identifier(table)), [(vec, ws, rid) for ws, rid, vec in rows])
        return max(cur.rowcount, 0)


async def unsettled_drawers(conn: AsyncConnection[Any], model: str, after: tuple[str, str], limit: int) -> list[
        tuple[str, str, str, str, str | None, str | None]]:
    """Drawers embedded since the switch by a model other than the active one (a service that had not
    looked at the active space yet), keyset-paged from ``after``: (workspace_id, id, content_hash,
    content, speaker, context). New drawers, and drawers that existed before the switch too: those hold
    their former vector in ``embedding_old`` as well, and a stale service embeds them again when their
    text changes (a forget re-points a shared drawer)."""
    cur = await conn.execute(
        """SELECT workspace_id, id, content_hash, content, speaker, context FROM drawers
            WHERE (workspace_id, id) > (%s, %s) AND embedding IS NOT NULL
              AND embedding_model IS DISTINCT FROM %s
            ORDER BY workspace_id, id LIMIT %s""", (*after, model, limit))
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def replace_vectors(conn: AsyncConnection[Any], model: str, rows: list[tuple[str, str, str, np.ndarray]]) -> int:
    """Overwrite active-space vectors of unsettled drawers: rows are (workspace_id, id, content_hash, vector)."""
    n = 0
    async with conn.cursor() as cur:
        for ws, did, chash, vec in rows:
            await cur.execute("UPDATE drawers SET embedding = %s, embedding_model = %s WHERE workspace_id = %s"
                              " AND id = %s AND content_hash = %s AND embedding_model IS DISTINCT FROM %s",
                              (vec, model, ws, did, chash, model))
            n += cur.rowcount
    return n


def _next_index(workspace_id: str) -> str:
    return index_name_for(workspace_id) + "_next"


def _old_index(workspace_id: str) -> str:
    return index_name_for(workspace_id) + "_old"


async def ready_index_workspaces(conn: AsyncConnection[Any]) -> list[str]:
    """Workspaces searched through an HNSW index of their own: the new space needs one too before the switch."""
    cur = await conn.execute("SELECT workspace_id FROM vector_indexes WHERE state IN ('ready', 'building')"
                             " ORDER BY workspace_id")
    return [r[0] for r in await cur.fetchall()]


async def build_next_index(conn: AsyncConnection[Any], workspace_id: str, *, m: int = 16,
                           ef_construction: int = 64) -> None:
    """The workspace's partial HNSW index over the new space, built without blocking writes (autocommit,
    login role); it takes the workspace's usual index name at the switch."""
    name = _next_index(workspace_id)
    cur = await conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (name,))
    row = await cur.fetchone()
    if row and row[0]:
        return
    await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    await conn.execute("SET maintenance_work_mem = '256MB'")
    await build_serially_unless_fixed(conn)
    await conn.execute(sql.SQL(
        "CREATE INDEX CONCURRENTLY {name} ON drawers USING hnsw (embedding_next vector_cosine_ops)"
        " WITH (m = {m}, ef_construction = {ef}) WHERE {where}").format(
        name=sql.Identifier(name), m=sql.Literal(m), ef=sql.Literal(ef_construction),
        where=index_predicate(workspace_id)))


async def switch_space(conn: AsyncConnection[Any], lock_timeout_s: float = 0.5,
                       timings: dict[str, float] | None = None) -> dict[str, int] | Space:
    """Make the building space active in one transaction, or report what is still to do.

    Under locks on the three tables (taken with a timeout: a long transaction holding one makes this
    try again rather than stall every search queued behind the lock) the to-do counts are checked
    again; rows that arrived since the last catch-up abort the switch with their counts. Otherwise
    columns and indexes are renamed, the type centroids (derived from the old vectors, recomputed by
    classify) are cleared, and the spaces' states flip — all in one round trip, since searches wait
    for as long as the locks are held. ``conn`` is the login role's, autocommit. ``timings``
    receives how long the locks took to get (``wait_s``) and were held (``held_s``).
    """
    t0 = time.perf_counter()
    async with conn.transaction():
        await conn.execute(sql.SQL("SET LOCAL lock_timeout = {}; LOCK TABLE drawers, episodes, entities, "
                                   "type_centroids, vector_indexes IN ACCESS EXCLUSIVE MODE").format(
            sql.Literal(f"{int(lock_timeout_s * 1000)}ms")))
        t1 = time.perf_counter()
        await conn.execute("SET LOCAL ROLE palace_maintenance")
        cur = await conn.execute(
            """SELECT (SELECT count(*) FROM drawers WHERE embedding IS NOT NULL AND embedding_next IS NULL),
                      (SELECT count(*) FROM episodes WHERE embedding IS NOT NULL AND embedding_next IS NULL),
                      (SELECT count(*) FROM entities WHERE embedding IS NOT NULL AND embedding_next IS NULL),
                      (SELECT array_agg(workspace_id) FROM vector_indexes)""")
        row = await cur.fetchone()
        assert row is not None
        left = dict(zip(TABLES, (int(row[0]), int(row[1]), int(row[2])), strict=True))
        if any(left.values()):
            return left
        indexed: list[str] = row[3] or []
        new, old = await building_space(conn), await active_space(conn)
        if new is None:
            raise RuntimeError("no embedding space is building")
        cur = await conn.execute("SELECT ws, to_regclass(a) IS NOT NULL, to_regclass(b) IS NOT NULL"
                                 " FROM unnest(%s::text[], %s::text[], %s::text[]) AS x(ws, a, b)",
                                 (indexed, [index_name_for(w) for w in indexed], [_next_index(w) for w in indexed]))
        have = await cur.fetchall()
        rebuilt = [ws for ws, _had, built in have if built]
        steps: list[sql.Composable] = [sql.SQL("RESET ROLE")]
        steps += [sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(_TRIGGER), sql.Identifier(t))
                  for t in TABLES]
        for t in TABLES:
            steps += [sql.SQL("ALTER TABLE {} RENAME COLUMN embedding TO embedding_old").format(sql.Identifier(t)),
                      sql.SQL("ALTER TABLE {} RENAME COLUMN embedding_next TO embedding").format(sql.Identifier(t))]
        for ws, had, built in have:
            if had:
                steps.append(sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    sql.Identifier(index_name_for(ws)), sql.Identifier(_old_index(ws))))
            if built:
                steps.append(sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    sql.Identifier(_next_index(ws)), sql.Identifier(index_name_for(ws))))
        steps += [
            sql.SQL("UPDATE palace_meta SET value = {} WHERE key = 'embed_dim'").format(sql.Literal(str(new.dim))),
            sql.SQL("SET LOCAL ROLE palace_maintenance"),
            sql.SQL("DELETE FROM type_centroids"),
            # A workspace whose index was asked for or finished while the space built has none over the
            # new vectors: maintain builds it again.
            sql.SQL("UPDATE vector_indexes SET state = 'wanted', ready_at = NULL WHERE state IN ('ready', 'building')"
                    " AND workspace_id <> ALL({})").format(sql.Literal(rebuilt)),
        ]
        if old is not None:
            steps.append(sql.SQL("UPDATE embedding_spaces SET state = 'retired', retired_at = now() WHERE id = {}")
                         .format(sql.Literal(old.id)))
        steps += [sql.SQL("UPDATE embedding_spaces SET state = 'active', activated_at = now() WHERE id = {}")
                  .format(sql.Literal(new.id)), sql.SQL("RESET ROLE")]
        await conn.execute(sql.SQL("; ").join(steps))
    if timings is not None:
        timings.update(wait_s=t1 - t0, held_s=time.perf_counter() - t1)
    return Space(new.id, new.provider, new.model, new.base_url, new.dim, "active")


async def drop_todo_index(conn: AsyncConnection[Any]) -> None:
    """The build's to-do indexes, after the switch, without blocking writes (autocommit, login role)."""
    for index in _TODO_INDEX.values():
        await conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(index)))


async def drop_old_space(conn: AsyncConnection[Any], keep_model: str | None) -> bool:
    """Drop the retired space's columns (their indexes go with them) and the cache entries of every
    model but ``keep_model`` (the active embedder's name; None keeps the whole cache). False when there
    was none. ``conn``: the login role's, autocommit."""
    if not await old_space_exists(conn):
        return False
    for table in TABLES:
        await conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS embedding_old").format(
            sql.Identifier(table)))
    if keep_model is None:
        return True
    await conn.execute("SET ROLE palace_maintenance")
    try:
        await conn.execute("DELETE FROM embedding_cache WHERE model <> %s", (keep_model,))
    finally:
        await conn.execute("RESET ROLE")
    return True
