"""type_centroids: read them for the centroid phase, recompute them from LLM-labelled drawers."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from shared.db.drawers import as_array
from shared.memory.centroids import Centroid, compute_centroids, source_hash

__all__ = ["TRAINING_PAIRS_SQL", "TRAINING_SET_SQL", "load_centroids", "recompute_centroids"]

# The training set: the workspace's live LLM-labelled drawers (partial index drawers_llm_labelled, 0035).
_TRAINING = ("FROM drawers WHERE workspace_id = %s AND pipeline_tier = 'llm' AND deleted_at IS NULL"
             " AND memory_type IS NOT NULL AND embedding IS NOT NULL")
TRAINING_PAIRS_SQL = "SELECT id, memory_type " + _TRAINING
TRAINING_SET_SQL = "SELECT memory_type, embedding " + _TRAINING


async def load_centroids(conn: AsyncConnection[Any], workspace_id: str) -> list[Centroid]:
    cur = await conn.execute(
        "SELECT memory_type, centroid, sample_count FROM type_centroids WHERE workspace_id = %s", (workspace_id,)
    )
    return [Centroid(r[0], as_array(r[1]), int(r[2])) for r in await cur.fetchall()]


async def recompute_centroids(conn: AsyncConnection[Any], workspace_id: str) -> bool:
    """Rebuild the workspace's centroids from its LLM-labelled drawers; False (and nothing written)
    when the training set is the one the stored centroids came from.

    The hash is checked on (id, type) pairs first, so an unchanged set costs no embedding reads.
    """
    cur = await conn.execute(TRAINING_PAIRS_SQL, (workspace_id,))
    pairs = [(r[0], r[1]) for r in await cur.fetchall()]
    digest = source_hash(pairs)
    cur = await conn.execute("SELECT DISTINCT source_hash FROM type_centroids WHERE workspace_id = %s",
                             (workspace_id,))
    stored = {r[0] for r in await cur.fetchall()}
    if stored == {digest} or (not stored and not pairs):
        return False
    cur = await conn.execute(TRAINING_SET_SQL, (workspace_id,))
    centroids = compute_centroids((r[0], as_array(r[1])) for r in await cur.fetchall())
    await conn.execute("DELETE FROM type_centroids WHERE workspace_id = %s", (workspace_id,))
    async with conn.cursor() as c:
        await c.executemany(
            "INSERT INTO type_centroids (workspace_id, memory_type, centroid, sample_count, source_hash)"
            " VALUES (%s, %s, %s, %s, %s)",
            [(workspace_id, ce.memory_type, ce.vector, ce.sample_count, digest) for ce in centroids],
        )
    return True
