"""Wording bands written for drawers filed before bands existed (cluster's backfill): one statement per
batch, each drawer its own list, whatever their lengths, and only the workspace named."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from shared.db.drawers import set_dedup_bands
from shared.db.pool import open_pool
from shared.db.tenancy import maintenance_tx
from shared.memory.dedup import wording_bands
from tests.integration.helpers import Stack, ws

pytestmark = pytest.mark.integration


def test_backfilled_bands_land_on_their_own_drawers(stack: Stack) -> None:
    w, other = ws(), ws()
    texts = {"a": "the deploy runs migrations before the canary", "b": "short", "c": ""}
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for workspace in (w, other):
            for did, text in texts.items():
                # dedup_bands set to '{}' at once: the running stack's own backfill must not race this test
                conn.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, state, dedup_bands)"
                             " VALUES (%s, %s, %s, md5(%s), 'processed', '{}')", (workspace, did, text, did))
    want = {did: wording_bands(w, text) for did, text in texts.items()}
    want["c"] = []  # an empty list is a value too

    async def write() -> None:
        pool = await open_pool(stack.database_url, name="test-bands", max_size=1)
        try:
            async with maintenance_tx(pool) as conn:
                await set_dedup_bands(conn, w, list(want.items()))
                await set_dedup_bands(conn, w, [])
        finally:
            await pool.close()

    asyncio.run(write())
    got = dict(stack.sql("SELECT id, dedup_bands FROM drawers WHERE workspace_id = %s", (w,)))
    assert got == want
    assert all(b == [] for (b,) in stack.sql("SELECT dedup_bands FROM drawers WHERE workspace_id = %s", (other,)))
