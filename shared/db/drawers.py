"""Drawer reads and state transitions used by the embed, classify and cluster stages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from shared.ids import stable_id
from shared.memory.kg import KG_MIN_IMPORTANCE

__all__ = [
    "BY_ID_SQL",
    "OLDER_TWINS_SQL",
    "WORKSPACE_SIZE_SQL",
    "DrawerRow",
    "as_array",
    "cached_embeddings",
    "drawers_by_id",
    "drawers_missing_bands",
    "history_id_for",
    "note_failure",
    "older_neighbours",
    "older_twins",
    "record_history",
    "recorded_value",
    "save_classifications",
    "save_embeddings",
    "set_dedup_bands",
    "workspace_size",
]


def as_array(v: Any) -> np.ndarray:
    """A ``vector`` column value as a float32 array.

    pgvector >= 0.4 loads ``vector`` as ``pgvector.Vector``, which ``np.asarray`` cannot convert
    (``float() argument must be ... not 'Vector'``): enrich failed on every session whose drawers
    were already embedded, and embed on every embedding-cache hit.
    """
    to_numpy = getattr(v, "to_numpy", None)
    return np.asarray(to_numpy() if to_numpy is not None else v, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class DrawerRow:
    id: str
    content: str
    content_hash: str
    state: str
    room: str
    has_embedding: bool
    embedding: np.ndarray | None = None
    speaker: str | None = None
    context: str | None = None
    failure_reason: str | None = None
    dedup_bands: list[int] | None = None  # the wording bands ingest stored (None for an older drawer)


BY_ID_SQL = """SELECT id, content, content_hash, state, room, embedding IS NOT NULL,
                  CASE WHEN %(emb)s THEN embedding END, speaker, context, failure_reason,
                  CASE WHEN %(emb)s THEN dedup_bands END
             FROM drawers WHERE workspace_id = %(ws)s AND id = ANY(%(ids)s)
              AND CASE WHEN deleted_at IS NULL THEN true END  -- by key only: docs/scale.md"""


async def drawers_by_id(
    conn: AsyncConnection[Any], workspace_id: str, ids: list[str], *, with_embedding: bool = False
) -> list[DrawerRow]:
    """The live (not deleted) drawers among ``ids``. Read in binary: a vector in text is hundreds of
    decimal numbers for the client to parse, in binary one copy of its floats. ``with_embedding`` also
    reads the wording bands, which whoever compares drawers needs beside the vector."""
    cur = await conn.execute(BY_ID_SQL, {"emb": with_embedding, "ws": workspace_id, "ids": ids}, binary=True)
    return [DrawerRow(*r) for r in await cur.fetchall()]


async def cached_embeddings(
    conn: AsyncConnection[Any], workspace_id: str, model: str, hashes: list[str]
) -> dict[str, np.ndarray]:
    cur = await conn.execute(
        "SELECT content_hash, embedding FROM embedding_cache WHERE workspace_id = %s AND model = %s"
        " AND content_hash = ANY(%s)",
        (workspace_id, model, hashes),
    )
    return {r[0]: as_array(r[1]) for r in await cur.fetchall()}


async def save_embeddings(
    conn: AsyncConnection[Any], workspace_id: str, model: str,
    rows: list[tuple[str, str, np.ndarray, str, str | None, str | None]], *, cache_new: bool = True,
) -> int:
    """Set embeddings on drawers still lacking one; fill the cache.

    A drawer maintain had given up on (``failed``: still raw after every re-drive, typically an
    embedding endpoint that was down for long) goes back to ``raw`` with its recorded failure
    cleared, so re-driving its dead letter once the endpoint is fixed finishes it instead of
    leaving an embedded drawer marked failed.

    rows: (drawer_id, hash of the embedded text, vector, the content hash, context and speaker it was made
    from). A drawer whose text changed meanwhile keeps no vector of the old one (forget re-points a
    shared drawer to a surviving sighting, with its speaker and without the forgotten context; it is
    re-embedded later).
    """
    if not rows:
        return 0
    # One statement each for the drawers and the cache, with the vectors as arrays: a statement per
    # drawer (``executemany``) cost the client a message and the server an execution per row. The arrays
    # go in binary (``%b``): as text each vector is hundreds of decimal numbers to format and parse.
    cur = await conn.execute(
        """UPDATE drawers d SET embedding = x.vec, embedding_model = %s, failure_reason = NULL,
                  state = CASE WHEN d.state = 'failed' THEN 'raw' ELSE d.state END, updated_at = now()
             FROM unnest(%s::text[], %b::vector[], %s::text[], %s::text[], %s::text[]) AS x(id, vec, chash, ctx, who)
            WHERE d.workspace_id = %s AND d.id = x.id AND d.embedding IS NULL
              AND d.content_hash = x.chash AND d.context IS NOT DISTINCT FROM x.ctx
              AND d.speaker IS NOT DISTINCT FROM x.who
        RETURNING d.id""",
        (model, [r[0] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows],
         [r[5] for r in rows], workspace_id),
    )
    updated = {str(r[0]) for r in await cur.fetchall()}
    # Only texts of drawers that still exist are cached: a drawer forgotten while its embedding
    # was computed leaves no cache entry behind.
    cacheable = [(h, vec) for did, h, vec, _, _, _ in rows if did in updated]
    if cache_new and cacheable:
        await conn.execute(
            """INSERT INTO embedding_cache (workspace_id, model, content_hash, embedding)
               SELECT %s, %s, h, v FROM unnest(%s::text[], %b::vector[]) AS c(h, v)
               ON CONFLICT DO NOTHING""",
            (workspace_id, model, [h for h, _ in cacheable], [v for _, v in cacheable]),
        )
    return len(rows)


# Why the last attempt on these drawers, still raw, failed.
NOTE_FAILURE_SQL = """UPDATE drawers SET failure_reason = %s WHERE workspace_id = %s AND id = ANY(%s)
                         AND CASE WHEN state = 'raw' THEN true END  -- by key only: docs/scale.md"""


async def note_failure(conn: AsyncConnection[Any], workspace_id: str, ids: list[str], reason: str) -> int:
    """Remember why the last attempt on these still-raw drawers failed.

    The drawer stays raw (the event is retried, and maintain re-drives it); if it is never
    processed, maintain marks it failed and this reason is what the operator reads. ``updated_at``
    is left alone: it is the clock maintain's stuck-drawer sweep runs on.
    """
    cur = await conn.execute(NOTE_FAILURE_SQL, (reason[:1000], workspace_id, ids))
    return cur.rowcount


# The important ones among classifier outcomes queued for semantic extraction (migration 0042: the sweep
# reads those that their session's extraction has not read by then), before their drawers are written
# (SAVE_CLASSIFICATIONS_SQL): every writer of a drawer's queue row takes it before the drawer's row, in id
# order (an extractor marks the queue rows it reads, then updates the drawers' counts); queued after the
# drawers' update, a classify batch and an episode's extraction side by side deadlocked. Only drawers still
# waiting for a label, as the update writes (by key; the state as a CASE: docs/scale.md).
QUEUE_CLASSIFIED_SQL = """
    INSERT INTO drawer_extraction (workspace_id, drawer_id, due_at)
    SELECT %(ws)s, c.id, now()
      FROM unnest(%(ids)s::text[], %(imps)s::real[]) AS c(id, importance)
     WHERE c.importance >= %(min_imp)s
       AND EXISTS (SELECT 1 FROM drawers d WHERE d.workspace_id = %(ws)s AND d.id = c.id
                      AND CASE WHEN d.state IN ('raw', 'failed') THEN true END)  -- by key only: docs/scale.md
     ORDER BY c.id
    ON CONFLICT DO NOTHING"""

# Classifier outcomes onto the drawers still raw (or failed).
SAVE_CLASSIFICATIONS_SQL = """
        UPDATE drawers d
           SET memory_type = c.memory_type, confidence = c.confidence, importance = c.importance,
               pipeline_tier = c.tier, state = 'processed', failure_reason = NULL, updated_at = now(),
               room = CASE WHEN d.room = 'general' THEN c.memory_type ELSE d.room END
          FROM unnest(%(ids)s::text[], %(types)s::text[], %(confs)s::real[], %(imps)s::real[], %(tiers)s::text[])
               AS c(id, memory_type, confidence, importance, tier)
         WHERE d.workspace_id = %(ws)s AND d.id = c.id
           AND CASE WHEN d.state IN ('raw', 'failed') THEN true END  -- by key only: docs/scale.md
        RETURNING d.id
    """


async def save_classifications(
    conn: AsyncConnection[Any], workspace_id: str, rows: list[dict[str, Any]], *, event_id: str | None, actor: str
) -> int:
    """Apply classifier outcomes to drawers still raw, or failed by maintain while their work was only
    queued behind a backlog (a late success beats a give-up); audit each one, under the row's own
    ``event_id`` when it has one (a batch of events), else ``event_id``. Returns drawers changed.

    One UPDATE for the whole list and one round trip for its audit rows: a statement per drawer cost a
    round trip and a plan each."""
    if not rows:
        return 0
    p = {"ws": workspace_id, "min_imp": KG_MIN_IMPORTANCE, "ids": [r["id"] for r in rows],
         "types": [r["memory_type"] for r in rows], "confs": [r["confidence"] for r in rows],
         "imps": [r["importance"] for r in rows], "tiers": [r["tier"] for r in rows]}
    async with conn.pipeline():  # the queue rows, then the drawers: two statements, one round trip
        await conn.execute(QUEUE_CLASSIFIED_SQL, p)
        cur = await conn.execute(SAVE_CLASSIFICATIONS_SQL, p)
    changed = {r[0] for r in await cur.fetchall()}
    await insert_history(conn, workspace_id, [
        {"drawer_id": r["id"], "action": "CLASSIFY", "actor": actor, "event_id": r.get("event_id", event_id),
         "reason": f"{r['tier']} confidence {r['confidence']}",
         "new_value": {k: r[k] for k in ("memory_type", "confidence", "importance", "tier")}}
        for r in rows if r["id"] in changed])
    return len(changed)


async def insert_history(conn: AsyncConnection[Any], workspace_id: str, rows: list[dict[str, Any]]) -> None:
    """Append audit rows (keys as ``record_history``'s arguments) in one statement; each id derives from
    (event, drawer, action), so a replay adds nothing. One INSERT of arrays: a row per statement
    (``executemany``) cost the client a message per row and the server an execution per row."""
    if not rows:
        return

    def js(v: Any) -> Any:
        return None if v is None else Jsonb(json.loads(json.dumps(v, default=str)))

    cols: list[list[Any]] = [[], [], [], [], [], [], [], []]
    for r in rows:
        for col, v in zip(cols, (
            history_id_for(workspace_id, r.get("event_id"), r.get("drawer_id"), r["action"]), r.get("drawer_id"),
            r["action"], r["actor"], r.get("reason"), js(r.get("old_value")), js(r.get("new_value")),
            r.get("event_id"),
        ), strict=True):
            col.append(v)
    await conn.execute(
        """INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, old_value, new_value,
                                       event_id)
           SELECT %s, i, d, a, w, r, o, n, e
             FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::jsonb[], %s::jsonb[],
                         %s::text[]) AS h(i, d, a, w, r, o, n, e)
           ON CONFLICT DO NOTHING""",
        (workspace_id, *cols))


def history_id_for(workspace_id: str, event_id: str | None, drawer_id: str | None, action: str) -> str:
    """The id ``record_history`` gives the audit row of (event, drawer, action)."""
    return stable_id("history", workspace_id, event_id or "", drawer_id or "", action)


async def recorded_value(conn: AsyncConnection[Any], workspace_id: str, event_id: str | None,
                         drawer_id: str | None, action: str) -> Any:
    """The ``new_value`` of the audit row ``record_history`` wrote for (event, drawer, action), by primary
    key; None when there is none."""
    cur = await conn.execute("SELECT new_value FROM memory_history WHERE workspace_id = %s AND id = %s",
                             (workspace_id, history_id_for(workspace_id, event_id, drawer_id, action)))
    row = await cur.fetchone()
    return row[0] if row else None


async def record_history(
    conn: AsyncConnection[Any], workspace_id: str, *, drawer_id: str | None, action: str, actor: str,
    event_id: str | None, reason: str | None = None, old_value: Any = None, new_value: Any = None,
) -> None:
    """Append an audit row; its id derives from (event, drawer, action) so replays add nothing."""
    hid = history_id_for(workspace_id, event_id, drawer_id, action)
    await conn.execute(
        "INSERT INTO memory_history (workspace_id, id, drawer_id, action, actor, reason, old_value, new_value,"
        " event_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (workspace_id, hid, drawer_id, action, actor, reason,
         Jsonb(old_value) if old_value is not None else None,
         Jsonb(json.loads(json.dumps(new_value, default=str))) if new_value is not None else None, event_id),
    )


# Candidates from the wording index (palace_wording_candidates, migration 0017: capped, this workspace
# only), then the live, older ones by embedding distance.
OLDER_TWINS_SQL = """
    WITH me AS (SELECT filed_at FROM drawers WHERE workspace_id = %(ws)s AND id = %(id)s)
    SELECT d.id, 1 - (d.embedding <=> %(emb)s) AS sim, d.content
      FROM palace_wording_candidates(%(ws)s, %(bands)s::bigint[], 200) c
      JOIN drawers d ON d.workspace_id = %(ws)s AND d.id = c.id, me
     WHERE d.id <> %(id)s AND d.state = 'processed' AND d.deleted_at IS NULL AND d.embedding IS NOT NULL
       AND (d.filed_at, d.id) < (me.filed_at, %(id)s)
     ORDER BY d.embedding <=> %(emb)s LIMIT %(n)s
"""


async def older_twins(
    conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, embedding: np.ndarray, bands: list[int],
    limit: int = 5,
) -> list[tuple[str, float, str]]:
    """Live, processed drawers filed before this one that share a wording band with it (same workspace:
    the bands are keyed by it), nearest in embedding first: (id, cosine, content).

    Only older drawers qualify, so two near-duplicates classified at the same moment can never
    merge into each other (the newer one merges into the older one; the older one finds no twin).
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(OLDER_TWINS_SQL, {"ws": workspace_id, "id": drawer_id, "emb": embedding, "bands": bands,
                                            "n": limit})
        rows = await cur.fetchall()
    return [(r["id"], float(r["sim"]), r["content"]) for r in rows]


async def older_neighbours(
    conn: AsyncConnection[Any], workspace_id: str, drawer_id: str, embedding: np.ndarray, limit: int = 5,
) -> list[tuple[str, float, str]]:
    """Nearest live, processed drawers filed before this one by embedding, whatever their wording:
    (id, cosine, content), nearest first. Planned unprepared, so the workspace's own HNSW index serves it
    when it has one (migration 0019), and an exact scan of the workspace when it does not."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            """
            WITH me AS (SELECT filed_at FROM drawers WHERE workspace_id = %(ws)s AND id = %(id)s)
            SELECT d.id, 1 - (d.embedding <=> %(emb)s) AS sim, d.content FROM drawers d, me
             WHERE d.workspace_id = %(ws)s AND d.id <> %(id)s AND d.state = 'processed' AND d.deleted_at IS NULL
               AND d.embedding IS NOT NULL AND (d.filed_at, d.id) < (me.filed_at, %(id)s)
             ORDER BY d.embedding <=> %(emb)s LIMIT %(n)s
            """,
            {"ws": workspace_id, "id": drawer_id, "emb": embedding, "n": limit},
            prepare=False,
        )
        rows = await cur.fetchall()
    return [(r["id"], float(r["sim"]), r["content"]) for r in rows]


async def set_dedup_bands(conn: AsyncConnection[Any], workspace_id: str, rows: list[tuple[str, list[int]]]) -> None:
    """Record drawers' wording bands, so later drawers find them as candidates: one statement for the
    batch (each band list as array text, as unnest cannot pair ids with arrays of unequal length), so
    the rows stay locked for one round trip, not one per drawer."""
    if not rows:
        return
    await conn.execute(
        "UPDATE drawers d SET dedup_bands = v.bands::bigint[]"
        "  FROM unnest(%s::text[], %s::text[]) AS v(id, bands)"
        " WHERE d.workspace_id = %s AND d.id = v.id",
        ([r[0] for r in rows], ["{" + ",".join(map(str, r[1])) + "}" for r in rows], workspace_id))


async def drawers_missing_bands(conn: AsyncConnection[Any], limit: int) -> list[tuple[str, str, str]]:
    """(workspace_id, id, content) of processed drawers filed before wording bands existed."""
    cur = await conn.execute(
        """SELECT workspace_id, id, content FROM drawers
            WHERE dedup_bands IS NULL AND state = 'processed' AND deleted_at IS NULL
            ORDER BY filed_at LIMIT %s""",
        (limit,),
    )
    return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


# Live drawers that are not merged away: what an exact scan reads and a workspace's vector index holds.
WORKSPACE_SIZE_SQL = ("SELECT count(*) FROM (SELECT 1 FROM drawers WHERE workspace_id = %s AND deleted_at IS NULL"
                      " AND state <> 'merged' LIMIT %s) x")


async def workspace_size(conn: AsyncConnection[Any], workspace_id: str, cap: int) -> int:
    """Live, unmerged drawers in a workspace, counted up to ``cap`` (an index-only scan of at most
    ``cap`` rows): search and cluster only ask whether the workspace is past a threshold, so the count
    must not grow with it. Merged drawers do not count: no scan reads them and no index holds them, so a
    workspace of repeated messages (most merge into their first copy) is as cheap to scan as its
    distinct ones, and asking for an index at the count of its rows would pay for graph inserts early."""
    cur = await conn.execute(WORKSPACE_SIZE_SQL, (workspace_id, cap))
    row = await cur.fetchone()
    return int(row[0]) if row else 0
