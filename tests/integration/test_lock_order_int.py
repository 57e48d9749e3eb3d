"""Writers of a drawer's extraction-queue row and of the drawer's row take them in one order: the queue row
first. An extractor marks the drawers it reads (their queue rows), then updates their counts (the drawers'
rows); classify queued the important ones it labelled after writing their rows, and the two side by side
deadlocked (each waiting on the row the other held until PostgreSQL aborted one)."""

from __future__ import annotations

import asyncio

import psycopg

from shared.db.drawers import save_classifications
from shared.db.extraction_queue import mark_extracted
from shared.db.pool import open_pool
from shared.db.tenancy import workspace_tx
from tests.integration.helpers import Stack, ws


async def test_classify_and_an_extraction_of_the_same_drawer_side_by_side_both_commit(stack: Stack) -> None:
    w = ws()
    did = "lock-order-drawer"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, state)"
                     " VALUES (%s, %s, 'We agreed to ship on Friday.', 'h-lock-order', 'raw')", (w, did))
    pool = await open_pool(stack.database_url, name="test-lock-order", max_size=3)
    try:
        extractor_marked, extractor_done = asyncio.Event(), asyncio.Event()

        async def extractor() -> None:
            async with workspace_tx(pool, w) as conn:
                await mark_extracted(conn, w, [did])  # the queue row, held until commit
                extractor_marked.set()
                await asyncio.sleep(1.0)  # classify is now waiting on it
                # Then the drawer's row (record_extraction's count update), as an extraction does.
                await conn.execute("UPDATE drawers SET entity_count = 1 WHERE workspace_id = %s AND id = %s",
                                   (w, did))
            extractor_done.set()

        async def classify() -> int:
            await extractor_marked.wait()
            async with workspace_tx(pool, w) as conn:
                return await save_classifications(conn, w, [
                    {"id": did, "memory_type": "decision", "confidence": 0.9, "importance": 4.0,
                     "tier": "heuristic"}], event_id="lock-order", actor="classify")

        _, saved = await asyncio.wait_for(asyncio.gather(extractor(), classify()), 30)
    finally:
        await pool.close()
    assert saved == 1 and extractor_done.is_set()
    assert stack.sql("SELECT state, entity_count FROM drawers WHERE workspace_id = %s AND id = %s", (w, did)) == [
        ("processed", 1)]
    assert stack.sql("SELECT extracted_at IS NOT NULL FROM drawer_extraction WHERE workspace_id = %s", (w,)) == [
        (True,)]


async def test_an_entity_merge_and_an_extraction_naming_the_merged_entity_side_by_side_both_commit(
        stack: Stack) -> None:
    """A merge locks the pair of entities, then moves the loser's mentions and updates their drawers' counts;
    an extraction updates a drawer's counts and inserts mentions (whose foreign key takes KEY SHARE on the
    entity). With the pair locked FOR UPDATE, which that KEY SHARE waits on, the two deadlocked; a merge
    changes no key, and NO KEY UPDATE lets the insert through (the mention, on the merged entity, is one of
    the follow-ups dedup moves next)."""
    from shared.db.entity_dedup import merge_entities
    from shared.db.kg import ensure_entities, entity_id
    from shared.memory.entity_dedup import Decision

    w = ws()
    loser, survivor = entity_id(w, "Ana Lima"), entity_id(w, "Ana Lima-Souza")
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for d in ("lo-d1", "lo-d2"):
            conn.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, state)"
                         " VALUES (%s, %s, 'Ana Lima joined the team.', %s, 'processed')", (w, d, d))
    pool = await open_pool(stack.database_url, name="test-lock-order-merge", max_size=3)
    try:
        async with workspace_tx(pool, w) as conn:
            await ensure_entities(conn, w, [("Ana Lima", "person"), ("Ana Lima-Souza", "person")])
            await conn.execute("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)"
                               " VALUES (%s, %s, 'lo-d1', 0.8)", (w, loser))
        counted, merged = asyncio.Event(), asyncio.Event()

        async def extraction() -> None:
            async with workspace_tx(pool, w) as conn:
                await conn.execute("UPDATE drawers SET entity_count = 1 WHERE workspace_id = %s AND id = 'lo-d1'",
                                   (w,))
                counted.set()
                await asyncio.sleep(1.0)  # the merge now waits on lo-d1's row
                await conn.execute("INSERT INTO entity_mentions (workspace_id, entity_id, drawer_id, confidence)"
                                   " VALUES (%s, %s, 'lo-d2', 0.7)", (w, loser))

        async def merge() -> str | None:
            await counted.wait()
            async with workspace_tx(pool, w) as conn:
                out = await merge_entities(conn, w, Decision("merge", "operator", "test", survivor=survivor,
                                                             loser=loser), actor="test", event_id=None)
            merged.set()
            return out

        _, merge_id = await asyncio.wait_for(asyncio.gather(extraction(), merge()), 30)
    finally:
        await pool.close()
    assert merge_id is not None and merged.is_set()
    assert stack.sql("SELECT merged_into FROM entities WHERE workspace_id = %s AND id = %s", (w, loser)) == [
        (survivor,)]
