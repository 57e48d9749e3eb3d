"""Re-embedding: move every drawer, episode and entity to a new embedding model or dimension while the
pipeline keeps running and serving searches.

The new space is built beside the active one (shared/db/embedding_spaces.py): drawers are embedded in
small batches, each batch read in one short transaction, embedded with no transaction open, written
in another; episodes get the mean of their drawers' new vectors (as the enrich service builds them),
entities their name's. Rows that change or arrive meanwhile are caught up by further passes until a
switch transaction, under table locks, finds nothing left. Workspaces that search through an HNSW
index of their own get the new one built concurrently before the switch. Every step is idempotent
and its progress lives in the database, so a re-embed that crashed is resumed by running it again.

After the switch, services still on the old space (until their next look at the active space) may
write a vector of the old model for a new drawer; with another dimension the database refuses it
and the service retries in the new space, with the same dimension a settle pass re-embeds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from shared.adapters.space_embedder import embedder_for
from shared.config import Settings
from shared.db import embedding_spaces as db
from shared.db.tenancy import act_as_maintenance
from shared.ids import content_hash
from shared.logging import get_logger
from shared.memory.episodes import episode_embedding
from shared.memory.filing import embedding_text
from shared.ports import Embedder

__all__ = ["Progress", "ReembedResult", "abandon", "drop_old", "reembed"]

log = get_logger("palace.reembed")

Progress = Callable[[str, int, int], None]
"""Called with (phase, done, total) as the work advances (a progress bar, a log line)."""


@dataclass(frozen=True)
class ReembedResult:
    space: db.Space
    drawers: int
    episodes: int
    entities: int
    indexes: int
    switch_attempts: int
    switch_wait_s: float  # how long the successful switch waited for the tables' locks
    switch_held_s: float  # and held them (searches wait behind both)
    settled: int


async def _connect(database_url: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    await register_vector_async(conn)
    return conn


class _Maint:
    """A transaction as palace_maintenance on an autocommit connection (row-level security is forced)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._tx = self.conn.transaction()
        await self._tx.__aenter__()
        await act_as_maintenance(self.conn)
        return self.conn

    async def __aexit__(self, *exc: Any) -> None:
        await self._tx.__aexit__(*exc)


async def _write(conn: psycopg.AsyncConnection[Any], fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """One batch's writes in one transaction, tried again when PostgreSQL picks it as a deadlock's victim
    (a service's transaction may lock the same drawers in another order) or a serialization failure."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type((psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)),
        stop=stop_after_attempt(8), wait=wait_exponential_jitter(multiplier=0.05, max=2.0), reraise=True,
    ):
        with attempt:
            async with _Maint(conn):
                return await fn(conn, *args)
    raise AssertionError("unreachable")  # pragma: no cover


async def _drawers_pass(conn: psycopg.AsyncConnection[Any], emb: Embedder, batch: int, progress: Progress,
                        done: int, total: int) -> int:
    """Embed every drawer still to do; returns how many were written."""
    written = stalled = 0
    while True:
        async with _Maint(conn):
            rows = await db.drawers_todo(conn, batch)
            texts = {(r[0], r[1]): embedding_text(r[3], r[4], r[5]) for r in rows}
            hashes = {k: content_hash(t) for k, t in texts.items()}
            cached = await db.cached_vectors(conn, emb.model_name, sorted({(k[0], h) for k, h in hashes.items()}))
        if not rows:
            return written
        missing = list(dict.fromkeys(t for k, t in texts.items() if (k[0], hashes[k]) not in cached))
        vecs = dict(zip(missing, await emb.embed_documents(missing), strict=True)) if missing else {}
        out = []
        for ws, did, chash, _content, _speaker, context in rows:
            k = (ws, did)
            vec = cached.get((ws, hashes[k]))
            out.append((ws, did, chash, context, hashes[k], vec if vec is not None else vecs[texts[k]]))
        n = await _write(conn, db.save_drawer_vectors, emb.model_name, out)
        written += n
        done += len(rows)
        progress("drawers", done, max(total, done))
        stalled = stalled + 1 if n == 0 else 0
        if stalled >= 20:  # not a drawer changing under us any more: something refuses the writes
            raise RuntimeError(f"{len(rows)} drawers from {rows[0][0]}/{rows[0][1]} on could not be written")
        if n == 0:  # every row of the batch changed under us: read them again (their new text)
            await asyncio.sleep(0.1)


async def _episodes_pass(conn: psycopg.AsyncConnection[Any], emb: Embedder, batch: int, progress: Progress,
                         total: int) -> int:
    written = 0
    while True:
        async with _Maint(conn):
            rows = await db.episodes_todo(conn, batch)
            means = {}
            for ws, eid, session_id, _summary in rows:
                means[(ws, eid)] = episode_embedding(await db.episode_vectors(conn, ws, session_id))
        if not rows:
            return written
        # An episode none of whose drawers is left (forgotten) keeps a vector of its summary.
        lone = [(ws, eid, summary) for ws, eid, _s, summary in rows if means[(ws, eid)] is None]
        if lone:
            for (ws, eid, _), v in zip(lone, await emb.embed_documents([s for *_, s in lone]), strict=True):
                means[(ws, eid)] = v
        written += await _write(conn, db.save_vectors, "episodes", [(ws, eid, v) for (ws, eid), v in means.items()])
        progress("episodes", written, max(total, written))


async def _entities_pass(conn: psycopg.AsyncConnection[Any], emb: Embedder, batch: int, progress: Progress,
                         total: int) -> int:
    written = 0
    while True:
        async with _Maint(conn):
            rows = await db.entities_todo(conn, batch)
        if not rows:
            return written
        vecs = await emb.embed_documents([name for _, _, name in rows])
        written += await _write(conn, db.save_vectors, "entities", [
            (ws, eid, v) for (ws, eid, _), v in zip(rows, vecs, strict=True)])
        progress("entities", written, max(total, written))


async def _catch_up(conn: psycopg.AsyncConnection[Any], emb: Embedder, batch: int, progress: Progress) -> dict[
        str, int]:
    async with _Maint(conn):
        todo = await db.todo_counts(conn)
    return {
        # Drawers first: an episode's new vector is the mean of its drawers' new vectors.
        "drawers": await _drawers_pass(conn, emb, batch, progress, 0, todo["drawers"]),
        "episodes": await _episodes_pass(conn, emb, batch, progress, todo["episodes"]),
        "entities": await _entities_pass(conn, emb, batch, progress, todo["entities"]),
    }


async def _settle(conn: psycopg.AsyncConnection[Any], emb: Embedder, batch: int) -> int:
    """Re-embed drawers a service still on the old space embedded after the switch (same dimension
    only; another dimension is refused by the column): new since the switch, labelled with another model."""
    fixed = 0
    last = ("", "")
    while True:
        async with _Maint(conn):
            rows = await db.unsettled_drawers(conn, emb.model_name, last, batch)
        if not rows:
            return fixed
        last = (rows[-1][0], rows[-1][1])
        texts = [embedding_text(r[3], r[4], r[5]) for r in rows]
        vecs = await emb.embed_documents(texts)
        fixed += await _write(conn, db.replace_vectors, emb.model_name, [
            (r[0], r[1], r[2], v) for r, v in zip(rows, vecs, strict=True)])


async def reembed(settings: Settings, database_url: str, target: db.SpaceTarget, *, batch: int = 64,
                  progress: Progress | None = None, max_switch_attempts: int = 50) -> ReembedResult:
    """Build the space of ``target``, switch to it, and settle what services wrote meanwhile.

    Raises ValueError when another re-embed is under way for a different target, or the space before
    the last one was never dropped (``drop_old``: only two spaces fit beside each other).
    """
    report: Progress = progress or (lambda phase, done, total: None)
    emb = embedder_for(settings, target)
    if emb.dim != target.dim:
        raise ValueError(f"{target.provider} model {target.model} makes {emb.dim}-dimensional vectors, "
                         f"not {target.dim}")
    warm = getattr(emb, "warm_up", None)
    if warm is not None:
        await warm()
    conn = await _connect(database_url)
    try:
        if await db.old_space_exists(conn):
            raise ValueError("the retired space's vectors are still kept: drop them first (palace reembed --drop-old)")
        space = await db.start_space(conn, target)
        log.info("reembed_started", space=space.id, model=target.model, dim=target.dim)
        counts = await _catch_up(conn, emb, batch, report)
        # Partial HNSW indexes over the new vectors for the workspaces that search through one.
        wss = await _read(conn, db.ready_index_workspaces)
        for i, ws in enumerate(wss):
            report("indexes", i, len(wss))
            await db.build_next_index(conn, ws)
        report("indexes", len(wss), len(wss))
        attempts = 0
        while True:
            attempts += 1
            more = await _catch_up(conn, emb, batch, report)
            for k, v in more.items():
                counts[k] += v
            timings: dict[str, float] = {}
            try:
                switched = await db.switch_space(conn, timings=timings)
            except psycopg.errors.LockNotAvailable:
                switched = {"locked": 1}
            if isinstance(switched, db.Space):
                break
            if attempts >= max_switch_attempts:
                raise RuntimeError(f"the switch kept finding new rows ({switched}); run palace reembed again")
            await asyncio.sleep(min(0.1 * attempts, 2.0))
        log.info("reembed_switched", space=switched.id, attempts=attempts, **timings, **counts)
        report("switch", 1, 1)
        await db.drop_todo_index(conn)
        # Services look at the active space every embed_space_check_s: after two looks none is on the old.
        await asyncio.sleep(2 * settings.embed_space_check_s + 0.5)
        settled = await _settle(conn, emb, batch)
        report("settle", 1, 1)
        return ReembedResult(switched, counts["drawers"], counts["episodes"], counts["entities"], len(wss),
                             attempts, timings["wait_s"], timings["held_s"], settled)
    finally:
        await conn.close()
        await emb.aclose()


async def _read(conn: psycopg.AsyncConnection[Any], fn: Callable[..., Any]) -> Any:
    async with _Maint(conn):
        return await fn(conn)


async def abandon(database_url: str) -> bool:
    """Drop a re-embed under way (its columns, triggers and space row); the active space is untouched."""
    conn = await _connect(database_url)
    try:
        return await db.abandon_space(conn)
    finally:
        await conn.close()


async def drop_old(settings: Settings, database_url: str, *, keep_cache: bool = False) -> bool:
    """Drop the retired space's vectors and (unless ``keep_cache``: a re-embed about to start may be
    going back to that model) its cache entries; False when there were none."""
    conn = await _connect(database_url)
    try:
        active = await _read(conn, db.active_space)
        emb = embedder_for(settings, active.target if active else None)
        try:
            return await db.drop_old_space(conn, None if keep_cache else emb.model_name)
        finally:
            await emb.aclose()
    finally:
        await conn.close()
