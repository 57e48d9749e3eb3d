"""maintain's statistics watch: analyze a table as soon as its planner statistics would estimate a
sizeable workspace as nearly empty, or whole once autovacuum has fallen behind on it (``shared.db.statistics``
says why either makes plans scan the workspace), under a lease so one replica does it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from services._runtime import Deps, holder_name
from shared.db.lifecycle import release_lease
from shared.db.maintenance import take_lease
from shared.db.statistics import analyze_tables, blind_tables, stale_tables
from shared.db.tenancy import maintenance_tx
from shared.endpoints import resolve_urls
from shared.logging import get_logger
from shared.metrics import STATISTICS_REFRESHES

__all__ = ["refresh_statistics", "statistics_loop"]

log = get_logger("palace.maintain")
_LEASE_S = 120.0
_FORGET_KNOWN_S = 3600.0
_warned: dict[str, float] = {}  # table → when its "not allowed to analyze" warning may be logged again


async def refresh_statistics(deps: Deps, holder: str, known: set[tuple[str, str]] | None = None) -> list[str]:
    """One check; the tables it analyzed. The check only reads; the lease (a write) is taken only when
    there is a table to analyze, so that one replica does it."""
    async with maintenance_tx(deps.pool) as conn:
        blind = await blind_tables(conn, deps.settings.statistics_blind_rows, known=known)
        stale = set(await stale_tables(conn, deps.settings.statistics_stale_rows))
    if not blind and not stale:
        return []
    async with maintenance_tx(deps.pool) as conn:
        if not await take_lease(conn, "statistics", holder, _LEASE_S, 0.0):
            return []
    try:
        db_url, _ = resolve_urls(deps.settings, nats=False)
        done, skipped = await analyze_tables(db_url, sorted(set(blind) | stale), whole=stale)
        for table, why in skipped.items():
            # Locked by an index build: next round. Not allowed (a login role that does not own the table):
            # every round, so said once an hour.
            if "lock" not in why and time.monotonic() >= _warned.get(table, 0.0):
                _warned[table] = time.monotonic() + 3600.0
                log.warning("statistics_not_refreshed", table=table, reason=why[:300])
        for table in done:
            STATISTICS_REFRESHES.labels(table).inc()
            unseen = blind.get(table, [])
            log.info("statistics_refreshed", table=table, whole=table in stale, workspaces=unseen[:5],
                     unseen=len(unseen))
        return done
    finally:
        with contextlib.suppress(Exception):
            async with maintenance_tx(deps.pool) as conn:
                await release_lease(conn, "statistics", holder)


async def statistics_loop(deps: Deps, stop: asyncio.Event) -> None:
    holder = holder_name()
    known: set[tuple[str, str]] = set()
    forget_at = time.monotonic() + _FORGET_KNOWN_S
    while not stop.is_set():
        if time.monotonic() >= forget_at:  # a workspace emptied and refilled would stay "known": ask again
            known.clear()
            forget_at = time.monotonic() + _FORGET_KNOWN_S
        try:
            await refresh_statistics(deps, holder, known)
        except Exception as e:  # retried next round; never kills the service
            log.warning("statistics_check_failed", error=repr(e)[:300])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), deps.settings.statistics_poll_s)
