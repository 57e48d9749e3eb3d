"""The workspace transaction (shared.db.tenancy): BEGIN and the workspace scope in one round trip, and the
pooled connection handed back exactly as it came, whatever happened inside."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from shared.db.pool import open_pool
from shared.db.tenancy import maintenance_tx, scoped_statement, workspace_tx
from tests.integration.helpers import Stack, ws

_IDLE = psycopg.pq.TransactionStatus.IDLE


async def _setting(conn: psycopg.AsyncConnection) -> str:  # type: ignore[type-arg]
    row = await (await conn.execute("SELECT current_setting('palace.workspace_id', true)")).fetchone()
    return str(row[0] if row else "")


async def test_scoped_transaction_commits_rolls_back_and_returns_the_connection_as_it_came(stack: Stack) -> None:
    pool = await open_pool(stack.database_url, name="test-tenancy", max_size=1)
    a = ws()
    try:
        # A quote in the id travels bound client-side (a literal), never as SQL.
        async with workspace_tx(pool, a + "'") as conn:
            assert await _setting(conn) == a + "'"
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            async with conn.transaction():  # inside it: a savepoint, as inside conn.transaction()
                await conn.execute("SELECT 1")
        # Committed: a row written in one is seen by the next; the scope did not outlive its transaction.
        async with workspace_tx(pool, a) as conn:
            await conn.execute("INSERT INTO palace_graph_versions (workspace_id, version) VALUES (%s, 1)", (a,))
        async with pool.connection() as conn:
            assert not conn.autocommit and conn.info.transaction_status == _IDLE
            assert await _setting(conn) == ""
        # An error rolls everything back and reaches the caller; a savepoint's error stays inside it.
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with workspace_tx(pool, a) as conn:
                await conn.execute("UPDATE palace_graph_versions SET version = 7 WHERE workspace_id = %s", (a,))
                await conn.execute("SELECT 1/0")
        async with workspace_tx(pool, a) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with conn.transaction():
                    await conn.execute("SELECT 1/0")
            await conn.execute("UPDATE palace_graph_versions SET version = 3 WHERE workspace_id = %s", (a,))
        assert stack.sql("SELECT version FROM palace_graph_versions WHERE workspace_id = %s", (a,)) == [(3,)]
        # Cancelled mid-statement: the connection cannot be handed on half-way through, so it is closed
        # and the pool opens another, as it came (autocommit off, no scope).
        async def slow() -> None:
            async with workspace_tx(pool, a) as conn:
                await conn.execute("SELECT pg_sleep(10)")

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with pool.connection() as conn:
            assert not conn.autocommit and conn.info.transaction_status == _IDLE and await _setting(conn) == ""
        async with maintenance_tx(pool) as conn:
            assert (await (await conn.execute("SELECT current_user")).fetchone()) == ("palace_maintenance",)
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT current_user")).fetchone()) == ("palace_app",)
    finally:
        await pool.close()


async def test_a_scoped_statement_is_its_own_transaction_in_its_workspace(stack: Stack) -> None:
    pool = await open_pool(stack.database_url, name="test-tenancy-one", max_size=1)
    a, b = ws(), ws()
    try:
        for w in (a, b):
            async with workspace_tx(pool, w) as conn:
                await conn.execute("INSERT INTO palace_graph_versions (workspace_id, version) VALUES (%s, 1)", (w,))
        # No workspace filter at all: row-level security keeps it to a; the count is the statement's.
        n = await scoped_statement(pool, a, "UPDATE palace_graph_versions SET version = version + %(k)s", {"k": 4})
        assert n == 1
        assert stack.sql("SELECT workspace_id, version FROM palace_graph_versions WHERE workspace_id = ANY(%s)"
                         " ORDER BY version", ([a, b],)) == sorted([(a, 5), (b, 1)], key=lambda r: r[1])
        # An error rolls the statement back, reaches the caller and leaves the connection as it came.
        with pytest.raises(psycopg.errors.DivisionByZero):
            await scoped_statement(pool, a, "UPDATE palace_graph_versions SET version = version / 0", {})
        async with pool.connection() as conn:
            assert not conn.autocommit and conn.info.transaction_status == _IDLE and await _setting(conn) == ""
        assert stack.sql("SELECT version FROM palace_graph_versions WHERE workspace_id = %s", (a,)) == [(5,)]
    finally:
        await pool.close()


async def test_a_writer_begins_holding_the_forget_lock_and_never_asks_for_it_again(stack: Stack) -> None:
    """writer_tx takes forget's shared lock with its BEGIN (the lock forget's exclusive one waits on), held
    through a savepoint rolled back inside it, and lock_for_write then sends nothing. Elsewhere every
    lock_for_write asks the server: one taken inside a savepoint is released if the savepoint is rolled back,
    so none taken later is assumed held; nor does the mark outlive its transaction."""
    from shared.db.forget import lock_for_write, writer_tx

    pool = await open_pool(stack.database_url, name="test-tenancy-lock", max_size=1)
    a = ws()
    sent: list[str] = []

    def counting(conn: psycopg.AsyncConnection) -> None:  # type: ignore[type-arg]
        execute = conn.execute

        async def wrapped(query, params=None, **kw):  # type: ignore[no-untyped-def]
            sent.append(str(query))
            return await execute(query, params, **kw)
        conn.execute = wrapped  # type: ignore[method-assign]

    def forget_could_lock(w: str) -> bool:  # forget's exclusive lock, tried from another connection
        return bool(stack.sql("SELECT pg_try_advisory_xact_lock(hashtextextended('palace.forget:' || %s, 0))",
                              (w,))[0][0])
    try:
        async with writer_tx(pool, a + "'") as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with conn.transaction():
                    await conn.execute("SELECT 1/0")
            assert await asyncio.to_thread(forget_could_lock, a + "'") is False
            counting(conn)
            await lock_for_write(conn, a + "'")
            assert sent == []
            del conn.execute  # type: ignore[method-assign]
        assert await asyncio.to_thread(forget_could_lock, a + "'") is True
        async with pool.connection() as conn, conn.transaction():  # the same connection, not begun here
            counting(conn)
            await lock_for_write(conn, a + "'")
            assert len(sent) == 1
            del conn.execute  # type: ignore[method-assign]
        sent.clear()
        async with workspace_tx(pool, a) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                async with conn.transaction():
                    await lock_for_write(conn, a)
                    await conn.execute("SELECT 1/0")
            assert await asyncio.to_thread(forget_could_lock, a) is True  # released with its savepoint
            counting(conn)
            await lock_for_write(conn, a)
            await lock_for_write(conn, a)
            assert len(sent) == 2 and await asyncio.to_thread(forget_could_lock, a) is False
            del conn.execute  # type: ignore[method-assign]
    finally:
        await pool.close()
