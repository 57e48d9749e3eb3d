"""The palace graph's cache key: the layout version moves exactly when the taxonomy may change,
once per transaction, under row-level security, and the cached taxonomy follows it."""

from __future__ import annotations

import numpy as np

from shared.db.graph import graph_version
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from shared.palace_graph import PalaceGraph
from tests.integration.helpers import Stack, ws


async def test_layout_version_moves_with_the_taxonomy_only(stack: Stack) -> None:
    w, other = ws(), ws()
    pool = await open_pool(stack.database_url, name="test-graph", max_size=2)
    graph = PalaceGraph(pool)
    try:
        async def version(of: str = w) -> int:
            async with workspace_tx(pool, of) as conn:
                return await graph_version(conn, of)

        assert await version() == 0
        assert (await graph.taxonomy(w)).wings == {}
        async with workspace_tx(pool, w) as conn:
            for i in range(50):  # one transaction, many drawers: one bump
                # Raw, touched in the future: the stack's maintain would re-drive them as stuck, and classify
                # would file them by type while this test counts its own changes.
                await conn.execute(
                    "INSERT INTO drawers (workspace_id, id, content, content_hash, wing, room, updated_at)"
                    " VALUES (%s, md5(%s), %s, md5(%s), %s, 'general', now() + interval '1 day')",
                    (w, f"d{i}", f"content {i}", f"d{i}", "alice" if i % 2 else "bob"))
        assert await version() == 1
        assert (await graph.taxonomy(w)).wings == {"alice": {"general": 25}, "bob": {"general": 25}}
        assert await version(other) == 0, "another workspace's version does not move"

        async with workspace_tx(pool, w) as conn:  # embedding and access stats: layout unchanged
            await conn.execute("UPDATE drawers SET embedding = %s, access_count = access_count + 1,"
                               " importance = 4 WHERE workspace_id = %s",
                               (np.ones(stack.settings.embed_dim, dtype=np.float32), w))
        assert await version() == 1
        async with workspace_tx(pool, w) as conn:  # classification files 'general' drawers by type
            await conn.execute("UPDATE drawers SET room = 'fact' WHERE workspace_id = %s AND id = md5('d1')", (w,))
        assert await version() == 2
        assert (await graph.taxonomy(w)).wings["alice"] == {"fact": 1, "general": 24}
        async with workspace_tx(pool, w) as conn:
            await conn.execute("UPDATE drawers SET state = 'merged' WHERE workspace_id = %s AND id = md5('d3')", (w,))
        async with workspace_tx(pool, w) as conn:
            await conn.execute("UPDATE drawers SET deleted_at = now() WHERE workspace_id = %s AND id = md5('d5')", (w,))
        async with workspace_tx(pool, w) as conn:
            await conn.execute("DELETE FROM drawers WHERE workspace_id = %s AND id = md5('d7')", (w,))
        assert await version() == 5
        assert (await graph.taxonomy(w)).wings["alice"] == {"fact": 1, "general": 21}

        # Row-level security: the versions table is per workspace like every other.
        async with workspace_tx(pool, other) as conn:
            rows = await (await conn.execute("SELECT workspace_id FROM palace_graph_versions")).fetchall()
        assert rows == []
    finally:
        await pool.close()


def test_taxonomy_aggregate_can_use_a_workspace_index(stack: Stack) -> None:
    """The aggregate reads one workspace through an index, never the whole shared table (the test
    table is small, so the planner is told to avoid a sequential scan whenever it has a choice)."""
    import psycopg

    with psycopg.connect(stack.database_url) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT wing, room, count(*) FROM drawers WHERE workspace_id = 'x' AND deleted_at IS NULL"
            " AND state <> 'merged' GROUP BY wing, room").fetchall())
    assert "Seq Scan" not in plan and "workspace_id = 'x'" in plan, plan
