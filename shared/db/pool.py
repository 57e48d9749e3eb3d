"""Connection pool: one per process, opened in the service's lifespan, pgvector registered."""

from __future__ import annotations

import time
import weakref
from functools import partial
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from shared.logging import get_logger

__all__ = ["database_reachable", "open_pool", "ping", "wait_for_database"]

log = get_logger("palace.db")

# A connection handed out is checked (a round trip) only when it was not checked in this many seconds.
# Checking on every checkout doubled the round trips of a short transaction; a connection broken since
# its last check (the database restarted within the second) fails its statement as a transient error,
# which handlers retry in place, and the pool discards it on return.
CHECK_EVERY_S = 1.0
_checked: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = weakref.WeakKeyDictionary()


async def _check(conn: psycopg.AsyncConnection[Any]) -> None:
    now = time.monotonic()
    if now - _checked.get(conn, float("-inf")) < CHECK_EVERY_S:
        return
    await AsyncConnectionPool.check_connection(conn)
    _checked[conn] = now


async def _configure(conn: psycopg.AsyncConnection[Any], *, role: str | None) -> None:
    await register_vector_async(conn)
    # pgvector's default (40) caps what a filtered HNSW walk can return; search asks for 100 candidates.
    await conn.execute("SET hnsw.ef_search = 200")
    if role:
        # For the life of the connection: row-level security applies to everything it runs
        # (migration 0003), and each transaction names its workspace (shared.db.tenancy).
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    await conn.commit()


async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
    """One round trip: raises when the database does not answer (readiness checks)."""
    await conn.execute("SELECT 1")


def database_reachable(database_url: str, timeout_s: int = 2) -> bool:
    """Whether PostgreSQL at this URL accepts a connection and answers, within ``timeout_s`` to connect."""
    try:
        with psycopg.connect(database_url, connect_timeout=timeout_s) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


async def wait_for_database(database_url: str, max_wait_s: float = 300.0) -> None:
    """Block until PostgreSQL accepts connections: a service started before its database waits
    (with jittered backoff) instead of crash-looping."""
    async for attempt in AsyncRetrying(
        stop=stop_after_delay(max_wait_s),
        wait=wait_exponential_jitter(multiplier=0.2, max=5),
        retry=retry_if_exception_type(psycopg.OperationalError),
        reraise=True,
        before_sleep=lambda rs: log.warning("database_unavailable", attempt=rs.attempt_number),
    ):
        with attempt:
            conn = await psycopg.AsyncConnection.connect(database_url, connect_timeout=5)
            await conn.close()


async def open_pool(
    database_url: str, *, name: str, min_size: int = 1, max_size: int = 8, role: str | None = "palace_app"
) -> AsyncConnectionPool:
    """Open a pool with pgvector types registered on every connection.

    Args:
        database_url: PostgreSQL URL.
        name: shows in ``pg_stat_activity.application_name``.
        min_size: connections kept open.
        max_size: upper bound (bounds the service's database concurrency).
        role: the row-level-security role every connection switches to (PALACE_DB_ROLE); None keeps
            the login role, for deployments whose login role is itself restricted.
    """
    await wait_for_database(database_url)
    pool = AsyncConnectionPool(
        database_url, min_size=min_size, max_size=max_size, open=False, configure=partial(_configure, role=role),
        kwargs={"application_name": f"palace-{name}"}, reconnect_timeout=300, timeout=60,
        check=_check,
    )
    await pool.open(wait=True, timeout=60)
    return pool
