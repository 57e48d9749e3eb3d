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
