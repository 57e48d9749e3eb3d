"""Entities' mention counts and confidence kept by change rows (migration 0051) against real PostgreSQL:
every write of a mention (extraction and its replays with a new confidence, the inline linker, forget, a
merge and its revert) leaves counters equal to counting the mentions again; a refresh reads no mention
row, however many the entity has; and maintain's ``mentions`` job brings up to date what no extraction
refreshed (the linker's)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest

from shared.db.migrate import apply_migrations
from shared.memory.kg import Sighting, entity_id
from tests.integration.helpers import Stack, fresh_database

pytestmark = pytest.mark.integration

W = "ws-mentions"


@pytest.fixture
def database(stack: Stack) -> Iterator[str]:
    with fresh_database(stack, "palace_mentions") as url:
        apply_migrations(url, stack.settings.embed_dim)
        yield url


def _drawers(url: str, n: int, start: int = 0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO drawers (workspace_id, id, content, content_hash)
               SELECT %s, 'd' || i, 'Ada met Grace at the lab, turn ' || i, md5(i::text)
                 FROM generate_series(%s::integer, %s::integer) i""", (W, start, start + n - 1))


def _in_tx(url: str, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]], role: str = "palace_app") -> Any:
    """``fn`` in one transaction as ``role`` (the services' role scoped to the workspace, or maintenance)."""
    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            await conn.execute(f"SET ROLE {role}")
            await conn.execute("SELECT set_config('palace.workspace_id', %s, false)", (W,))
            out = await fn(conn)
            await conn.commit()
            return out
    return asyncio.run(go())


def _counters(url: str) -> dict[str, tuple[int, float | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, mention_count, confidence FROM entities WHERE workspace_id = %s",
                            (W,)).fetchall()
    return {str(n): (int(c), None if f is None else round(float(f), 4)) for n, c, f in rows}


def _recounted(url: str) -> dict[str, tuple[int, float | None]]:
    """What counting every mention again gives (what the counters must equal)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """SELECT e.name, count(m.entity_id), avg(m.confidence) FROM entities e
                 LEFT JOIN entity_mentions m ON m.workspace_id = e.workspace_id AND m.entity_id = e.id
                WHERE e.workspace_id = %s GROUP BY e.name""", (W,)).fetchall()
    return {str(n): (int(c), None if f is None else round(float(f), 4)) for n, c, f in rows}


def _refresh_all(url: str) -> None:
    from shared.db.kg import refresh_entities

    async def go(conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute("SELECT id FROM entities WHERE workspace_id = %s", (W,))
        await refresh_entities(conn, W, [r[0] for r in await cur.fetchall()])
    _in_tx(url, go)


def _extract(url: str, drawers: list[str], conf: float, names: tuple[str, ...] = ("Ada", "Grace")) -> None:
    from shared.db.kg import record_extraction

    sightings = [Sighting(d, None, None, None, entities=tuple((n, "person", conf) for n in names)) for d in drawers]
    _in_tx(url, lambda c: record_extraction(c, W, sightings))


def test_counters_follow_every_kind_of_mention_write(database: str) -> None:
    from shared.db.entity_dedup import merge_entities, revert_merge
    from shared.db.forget import delete_drawers
    from shared.db.kg import link_drawers
    from shared.memory.entity_dedup import Decision

    _drawers(database, 12)
    _extract(database, [f"d{i}" for i in range(6)], 0.9)
    _refresh_all(database)
    assert _counters(database) == _recounted(database) == {"Ada": (6, 0.9), "Grace": (6, 0.9)}

    # A replay of the same extraction with other confidences updates the mentions (ON CONFLICT DO UPDATE).
    _extract(database, ["d0", "d1"], 0.5)
    # The linker: mentions without a confidence, which count but do not move the mean.
    _in_tx(database, lambda c: link_drawers(c, W, [(f"d{i}", "Ada met Grace at the lab") for i in range(6, 10)]))
    _refresh_all(database)
    assert _counters(database) == _recounted(database)
    assert _counters(database)["Ada"][0] == 10

    # Forget two drawers (one extracted, one linked): their mentions go, the counters follow.
    _in_tx(database, lambda c: delete_drawers(c, W, ["d0", "d9"]))
    assert _counters(database) == _recounted(database)
    assert _counters(database)["Ada"][0] == 8

    # A merge moves one entity's mentions onto the other; its revert moves them back.
    _extract(database, ["d10", "d11"], 0.7, names=("Ada Lovelace",))
    same = Decision("merge", "test", "same person", survivor=entity_id(W, "Ada"), loser=entity_id(W, "Ada Lovelace"))
    merge_id = _in_tx(database, lambda c: merge_entities(c, W, same, actor="test", event_id=None))
    assert merge_id and _counters(database) == _recounted(database)
    _in_tx(database, lambda c: revert_merge(c, W, merge_id, actor="test"))
    _refresh_all(database)
    assert _counters(database) == _recounted(database)
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM entity_mention_changes").fetchone() == (0,)


def test_a_refresh_reads_no_mention_however_many_the_entity_has(database: str) -> None:
    from shared.db.kg import refresh_entities

    n = 20_000
    _drawers(database, n)
    _extract(database, [f"d{i}" for i in range(n)], 0.8, names=("Ada",))
    _refresh_all(database)
    _drawers(database, 1, start=n)
    _extract(database, [f"d{n}"], 0.2, names=("Ada",))

    async def refresh(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int, int]:
        changed = await refresh_entities(conn, W, [entity_id(W, "Ada")])
        cur = await conn.execute(
            """SELECT coalesce(sum(n) FILTER (WHERE relname = 'entity_mentions'), 0),
                      coalesce(sum(n) FILTER (WHERE relname = 'entity_mention_changes'), 0)
                 FROM (SELECT relname, seq_tup_read + coalesce(idx_tup_fetch, 0) AS n
                         FROM pg_stat_xact_user_tables) t""")
        row = await cur.fetchone()
        assert row is not None
        return changed, int(row[0]), int(row[1])

    changed, mention_rows, change_rows = _in_tx(database, refresh)
    assert changed == 1
    assert mention_rows == 0, f"the refresh read {mention_rows} mention rows"
    assert change_rows <= 4
    count, conf = _counters(database)["Ada"]
    assert count == n + 1 and conf == pytest.approx((0.8 * n + 0.2) / (n + 1), abs=1e-4)


def test_maintains_mentions_job_brings_the_linkers_mentions_into_the_counts(database: str) -> None:
    from shared.db.kg import link_drawers
    from shared.lifecycle import JOBS, run_job

    _drawers(database, 8)
    _extract(database, ["d0"], 0.9)
    _refresh_all(database)
    _in_tx(database, lambda c: link_drawers(c, W, [(f"d{i}", "Ada met Grace at the lab") for i in range(1, 8)]))
    assert _counters(database)["Ada"] == (1, 0.9)  # the linker never touches the entity's row

    async def go() -> dict[str, int] | None:
        from shared.config import Settings
        from shared.db.pool import open_pool

        settings = Settings(database_url=database, maintain_batch=1)  # one entity per batch: the walk goes on
        pool = await open_pool(database, name="test-mentions", max_size=2)
        try:
            return await run_job(JOBS["mentions"], pool=pool, settings=settings, holder="test", manual=True)
        finally:
            await pool.close()

    assert asyncio.run(go()) == {"entities": 2}
    assert _counters(database) == _recounted(database) == {"Ada": (8, 0.9), "Grace": (8, 0.9)}
