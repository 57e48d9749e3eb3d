"""Access statistics off the read path: a bounded, coalescing buffer flushed in the background.

Every drawer a layer or a search returns gets its access count and last-access time bumped
(shared/db/access.py). A search only *notes* its ids here, synchronously and without awaiting
anything; a background task writes what accumulated, one batched statement per workspace, on one
pooled connection at a time, taken with a short timeout. So access bookkeeping can hold at most one
connection of the pool, never queues behind a busy pool, and never delays a search. When the buffer
is full (the database is slow or down), further increments are dropped and counted: access
statistics are advisory, a search is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool

from shared.db.access import bump_access
from shared.db.tenancy import scope_to_workspace
from shared.logging import get_logger
from shared.metrics import ACCESS_UPDATES

__all__ = ["AccessLog", "access_log"]

log = get_logger("palace.access")


@dataclass(eq=False)
class AccessLog:
    """Pending access increments of one connection pool, per workspace and drawer."""

    pool: AsyncConnectionPool
    max_pending: int = 50_000  # distinct (workspace, drawer) pairs held before increments are dropped
    interval_s: float = 1.0
    acquire_timeout_s: float = 0.25
    lock_timeout_ms: int = 200
    dropped: int = 0
    _pending: dict[str, dict[str, tuple[int, datetime]]] = field(default_factory=dict)
    _size: int = 0
    _task: asyncio.Task[None] | None = None
    _flushing: asyncio.Lock | None = None

    @property
    def pending(self) -> int:
        """Distinct (workspace, drawer) pairs waiting to be written."""
        return self._size

    def note(self, workspace_id: str, ids: list[str], at: datetime | None = None) -> None:
        """Count one access of each of ``ids`` (never blocks, never raises for a full buffer)."""
        self._merge(workspace_id, {i: (1, at or datetime.now(UTC)) for i in ids})
        self._ensure_flusher()

    def _merge(self, workspace_id: str, counts: dict[str, tuple[int, datetime]]) -> None:
        ws = self._pending.setdefault(workspace_id, {})
        for did, (n, at) in counts.items():
            old = ws.get(did)
            if old is not None:
                ws[did] = (old[0] + n, max(old[1], at))
            elif self._size < self.max_pending:
                ws[did] = (n, at)
                self._size += 1
            else:
                self.dropped += n
                ACCESS_UPDATES.labels("dropped").inc(n)
        if not ws:
            del self._pending[workspace_id]

    def _ensure_flusher(self) -> None:
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next flush() writes it
            return
        self._task = loop.create_task(self._run(), name="palace-access-flush")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self._size:
                return  # restarted by the next note(); an idle process keeps no task alive
            await self.flush()

    async def flush(self) -> int:
        """Write what is pending now; returns rows written. Failures put the increments back (bounded)."""
        if self._flushing is None:
            self._flushing = asyncio.Lock()
        async with self._flushing:
            batch, self._pending, self._size = self._pending, {}, 0
            written = 0
            try:
                async with self.pool.connection(timeout=self.acquire_timeout_s) as conn:
                    for workspace_id, counts in batch.items():
                        try:
                            async with conn.transaction():
                                await scope_to_workspace(conn, workspace_id)
                                done = await bump_access(conn, workspace_id, counts,
                                                         lock_timeout_ms=self.lock_timeout_ms)
                        except Exception as e:  # lock timeout, or the connection broke
                            log.info("access_flush_retry", workspace_id=workspace_id, error=repr(e)[:200])
                            done = set()
                        written += len(done)
                        left = {d: v for d, v in counts.items() if d not in done}
                        if left:  # locked rows (or a failed statement): try again next time
                            ACCESS_UPDATES.labels("retried").inc(len(left))
                            self._merge(workspace_id, left)
            except Exception as e:  # pool busy or database down: keep what fits, try later
                log.info("access_flush_deferred", error=repr(e)[:200])
                for workspace_id, counts in batch.items():
                    ACCESS_UPDATES.labels("retried").inc(len(counts))
                    self._merge(workspace_id, counts)
            ACCESS_UPDATES.labels("written").inc(written)
            return written

    async def aclose(self) -> None:
        """Stop the background task and write what is pending (one attempt)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._size:
            await self.flush()


_logs: weakref.WeakKeyDictionary[AsyncConnectionPool, AccessLog] = weakref.WeakKeyDictionary()


def access_log(pool: AsyncConnectionPool) -> AccessLog:
    """The process's access buffer for ``pool`` (one per pool, so every caller's increments coalesce)."""
    log_ = _logs.get(pool)
    if log_ is None:
        log_ = _logs[pool] = AccessLog(pool)
    return log_
