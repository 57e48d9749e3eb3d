"""maintain's index builder: the per-workspace HNSW indexes that search asked for, one at a time, under
a lease (one replica builds; a build of a large workspace takes minutes and must not run twice), and
the lexicons of those workspaces (their common words, which full-text candidates leave out)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from services._runtime import Deps, holder_name
from shared.db.lexicon import refresh_lexicon, stale_lexicons
from shared.db.lifecycle import release_lease, renew_lease
from shared.db.maintenance import take_lease
from shared.db.tenancy import maintenance_tx
from shared.db.vector_indexes import (
    build_vector_index,
    oldest_wait_s,
    requeue_orphaned_builds,
    wanted_vector_indexes,
)
from shared.endpoints import resolve_urls
from shared.logging import get_logger
from shared.metrics import VECTOR_INDEX_BUILD_SECONDS, VECTOR_INDEX_BUILDS, VECTOR_INDEX_OLDEST_WAIT

__all__ = ["vector_index_loop"]

log = get_logger("palace.maintain")
# The build lease is renewed every _RENEW_S while builds run (a build of a large workspace takes minutes),
# so it can be short: a builder killed mid-build (OOM, SIGKILL) holds it for minutes, not hours, and the
# next holder asks for its half-done build again.
_LEASE_S = 300.0
_RENEW_S = 60.0


async def _keep_lease(deps: Deps, holder: str) -> None:
    """Renew the build lease until cancelled; a failed renewal is tried again next time (the lease
    outlives several)."""
    while True:
        await asyncio.sleep(_RENEW_S)
        with contextlib.suppress(Exception):
            async with maintenance_tx(deps.pool) as conn:
                if not await renew_lease(conn, "vector_indexes", holder, _LEASE_S):
                    log.warning("lease_lost", lease="vector_indexes", holder=holder)
                    return


async def pending_wait_s(deps: Deps) -> float | None:
    """Seconds the oldest pending request has waited, also set as the gauge (0 there when none waits);
    None when none waits or the database did not answer (asked again next poll)."""
    try:
        async with maintenance_tx(deps.pool) as conn:
            waited = await oldest_wait_s(conn)
    except Exception:
        return None
    VECTOR_INDEX_OLDEST_WAIT.set(waited or 0.0)
    return waited


async def build_wanted(deps: Deps, holder: str) -> int:
    """Build every wanted index if this replica holds the lease; returns how many were built. The poll
    calls it only when a request is pending (``pending_wait_s``): the lease is a write."""
    async with maintenance_tx(deps.pool) as conn:
        if not await take_lease(conn, "vector_indexes", holder, _LEASE_S, 0.0):
            return 0
        # Only the lease's holder builds, so a build still marked as running now is one whose builder died
        # (a crash, a killed pod): asked for again, or its workspace would be searched exactly for ever.
        await requeue_orphaned_builds(conn)
        wanted = await wanted_vector_indexes(conn)
    keeper = asyncio.create_task(_keep_lease(deps, holder), name="lease-vector_indexes")
    builds = asyncio.create_task(_build_each(deps, wanted), name="build-vector_indexes")
    try:
        # The keeper returns only when the lease is lost (its renewals failed until it expired and another
        # replica took it): that replica asks for this one's half-done build again, so the build stops here
        # (cancelling it cancels its statement on the server) rather than run twice at once.
        await asyncio.wait({keeper, builds}, return_when=asyncio.FIRST_COMPLETED)
        if not builds.done():
            log.warning("vector_index_builds_abandoned", reason="lease lost", holder=holder)
            return 0
        return builds.result()
    finally:
        for task in (builds, keeper):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with maintenance_tx(deps.pool) as conn:  # release: the next round may start at once
            await release_lease(conn, "vector_indexes", holder)


async def _build_each(deps: Deps, wanted: list[tuple[str, str]]) -> int:
    """Build the indexes one after another; one that fails is logged and asked for again later."""
    built = 0
    db_url, _ = resolve_urls(deps.settings)
    for ws, name in wanted:
        log.info("vector_index_building", workspace_id=ws, index=name)
        t0 = time.monotonic()
        try:
            await build_vector_index(db_url, ws, name)
        except Exception as e:
            VECTOR_INDEX_BUILDS.labels("failed").inc()
            log.warning("vector_index_failed", workspace_id=ws, index=name, error=repr(e)[:300], exc_info=e)
            continue
        VECTOR_INDEX_BUILDS.labels("ready").inc()
        VECTOR_INDEX_BUILD_SECONDS.observe(time.monotonic() - t0)
        built += 1
        log.info("vector_index_ready", workspace_id=ws, index=name, seconds=round(time.monotonic() - t0, 1))
    return built


async def refresh_lexicons(deps: Deps, holder: str) -> int:
    """Recount the common words of one workspace whose lexicon is missing or due (one per round: each
    is a pass over a large workspace); the lease keeps replicas from doing the same one twice."""
    s = deps.settings
    async with maintenance_tx(deps.pool) as conn:
        if not await take_lease(conn, "lexicons", holder, 600.0, 0.0):
            return 0
        due = await stale_lexicons(conn, s.lexicon_refresh_s)
    try:
        for ws in due:
            async with maintenance_tx(deps.pool) as conn:
                n = await refresh_lexicon(conn, ws, s.lexicon_common_share)
            log.info("lexicon_refreshed", workspace_id=ws, common_lexemes=n)
    finally:
        async with maintenance_tx(deps.pool) as conn:
            await release_lease(conn, "lexicons", holder)
    return len(due)


async def vector_index_loop(deps: Deps, stop: asyncio.Event) -> None:
    """Build requested indexes within ``vector_index_poll_s`` of the request: until one is ready, every
    event cluster handles and every search of that workspace scans it exactly, a cost growing with it,
    so a build waiting for the next minute's sweep was the largest cost of a fast-growing workspace.
    The poll reads a small table by its state. Lexicons are recounted on the sweep's interval."""
    s = deps.settings
    holder = holder_name()
    lexicons_due = 0.0
    while not stop.is_set():
        # One read a poll: how long the oldest pending request (wanted, or marked as building) has waited,
        # exported, and whether there is anything to build (or a dead builder's request to take over).
        if await pending_wait_s(deps) is not None:
            with contextlib.suppress(Exception):  # retried next round; never kills the service
                await build_wanted(deps, holder)
        if time.monotonic() >= lexicons_due:
            with contextlib.suppress(Exception):
                await refresh_lexicons(deps, holder)
            lexicons_due = time.monotonic() + s.maintain_interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(s.vector_index_poll_s, s.maintain_interval_s))
