"""Claims on drawers waiting for an LLM label (migration 0054) and the retry of failed drawers, at the
statements: a claim is its event's (another event leaves the drawer alone, the same event delivered again
takes it back), maintain's re-drive leaves a claimed drawer to its claimant, and ``palace retry-failed``
pages through a workspace's failed drawers, never taking one twice in a run however fast it fails again."""

from __future__ import annotations

import asyncio

import psycopg

from shared.db.curation import claim_for_llm, release_llm_claims
from shared.db.maintenance import revive_failed, stuck_drawers
from shared.db.pool import open_pool
from shared.db.tenancy import maintenance_tx, workspace_tx
from tests.integration.helpers import Stack, ws


def _insert(stack: Stack, w: str, ids: list[str], state: str) -> None:
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for n, did in enumerate(ids):
            # dedup_bands '{}': the running stack's own backfill leaves these rows alone
            conn.execute("INSERT INTO drawers (workspace_id, id, content, content_hash, state, dedup_bands, filed_at,"
                         " updated_at, failure_reason, metadata) VALUES (%s, %s, %s, md5(%s), %s, '{}',"
                         " timestamptz '2026-01-01' + %s * interval '1 s', now() - interval '1 hour', %s,"
                         " '{\"llm_failures\": 3}')",
                         (w, did, f"text {did}", did, state, n, "llm: down" if state == "failed" else None))


def test_a_claim_is_its_events_and_a_claimed_drawer_is_not_re_driven(stack: Stack) -> None:
    w = ws()
    _insert(stack, w, ["a", "b"], "raw")

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-claims", max_size=1)
        try:
            async with workspace_tx(pool, w) as conn:
                assert await claim_for_llm(conn, w, {"a": "event-1", "b": "event-1"}, 600) == {"a", "b"}
            async with workspace_tx(pool, w) as conn:
                assert await claim_for_llm(conn, w, {"a": "event-2"}, 600) == set()  # another event's drawer
                assert await claim_for_llm(conn, w, {"a": "event-1"}, 600) == {"a"}  # its own, delivered again
            async with maintenance_tx(pool) as conn:
                stuck = {d for x, d, _ in await stuck_drawers(conn, 0.0, 3, limit=100_000) if x == w}
            assert stuck == set(), "a drawer a model is being asked about is not re-driven"
            async with workspace_tx(pool, w) as conn:
                await release_llm_claims(conn, w, ["a"])
                assert await claim_for_llm(conn, w, {"a": "event-2"}, 600) == {"a"}
                await release_llm_claims(conn, w, ["a", "b"])
            async with maintenance_tx(pool) as conn:
                stuck = {d for x, d, _ in await stuck_drawers(conn, 0.0, 3, limit=100_000) if x == w}
            assert stuck == {"a", "b"}
        finally:
            await pool.close()

    asyncio.run(go())


def test_retry_failed_pages_through_and_never_takes_a_drawer_twice(stack: Stack) -> None:
    w = ws()
    _insert(stack, w, ["f1", "f2", "f3"], "failed")

    async def go() -> None:
        pool = await open_pool(stack.database_url, name="test-retry", max_size=1)
        try:
            async with workspace_tx(pool, w) as conn:
                first, after = await revive_failed(conn, w, None, 2)
            assert first == ["f1", "f2"] and after is not None
            # They fail again at once (the model still down): the run goes on past them.
            stack.sql("UPDATE drawers SET state = 'failed' WHERE workspace_id = %s AND id = ANY(%s) RETURNING 1",
                      (w, first))
            async with workspace_tx(pool, w) as conn:
                second, after = await revive_failed(conn, w, after, 2)
                assert second == ["f3"]
                assert await revive_failed(conn, w, after, 2) == ([], None)
        finally:
            await pool.close()

    asyncio.run(go())
    got = {r[0]: r[1:] for r in stack.sql("SELECT id, state, failure_reason, metadata ? 'llm_failures' FROM drawers"
                                          " WHERE workspace_id = %s", (w,))}
    assert got["f3"] == ("raw", None, False)
