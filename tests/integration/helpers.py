"""Helpers for tests against the real stack: publish, wait, query."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
import psycopg
from psycopg import sql

from palace_dev.supervisor import Supervisor
from shared.config import Settings
from tests.otlp_receiver import OtlpReceiver

T = TypeVar("T")


@dataclass
class Stack:
    settings: Settings
    supervisor: Supervisor
    database_url: str
    nats_url: str
    api_url: str
    otlp: OtlpReceiver | None = None  # where the services' spans arrive

    def publish(self, payload: bytes | dict[str, Any], subject: str = "session.completed",
                headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode() if isinstance(payload, dict) else payload

        async def go() -> None:
            nc = await nats.connect(self.nats_url)
            try:
                await nc.jetstream().publish(subject, data, headers=headers)
            finally:
                await nc.close()

        asyncio.run(go())

    def redeliver(self, event: Any, service: str, timeout: float = 30) -> None:
        """Publish ``event`` (a shared.events model) again, as JetStream redelivers it after an ack lost past
        the commit (a fresh Nats-Msg-Id, so the duplicate window does not drop it), and wait until
        ``service``'s consumer of its subject has acked it."""
        from shared.consumers import consumer_for

        durable = consumer_for(service, event.subject).durable

        async def go() -> None:
            nc = await nats.connect(self.nats_url)
            try:
                js = nc.jetstream()
                ack = await js.publish(event.subject, event.model_dump_json().encode(),
                                       headers={"Nats-Msg-Id": f"again-{uuid.uuid4().hex}"})
                deadline = time.monotonic() + timeout
                while (await js.consumer_info(self.settings.stream_name, durable)).ack_floor.stream_seq < ack.seq:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{durable} did not settle the redelivered {event.subject}")
                    await asyncio.sleep(0.1)
            finally:
                await nc.close()

        asyncio.run(go())

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url) as conn:
            return conn.execute(query, params).fetchall()  # type: ignore[arg-type]

    def search(self, workspace: str, query: str, k: int = 5) -> list[dict[str, Any]]:
        r = httpx.post(f"{self.api_url}/v1/search", json={"workspace_id": workspace, "query": query, "k": k},
                       timeout=30)
        r.raise_for_status()
        return r.json()["hits"]  # type: ignore[no-any-return]

    def wait_processed(self, workspace: str, n_drawers: int, timeout: float = 60, *, failed_ok: bool = False) -> None:
        """Wait until the workspace holds ``n_drawers`` drawers and none is raw. A failed drawer fails the
        wait at once unless ``failed_ok``: counted as done, it let a test whose pipeline broke every drawer
        (maintain fails drawers stuck raw within seconds here) pass on counts alone."""
        def done() -> bool:
            rows = self.sql("SELECT state, count(*) FROM drawers WHERE workspace_id = %s GROUP BY state",
                            (workspace,))
            by = dict(rows)
            if by.get("failed") and not failed_ok:
                why = self.sql("SELECT DISTINCT failure_reason FROM drawers WHERE workspace_id = %s"
                               " AND state = 'failed' LIMIT 3", (workspace,))
                raise AssertionError(f"{by['failed']} drawer(s) of {workspace} failed: {[r[0] for r in why]}")
            return sum(by.values()) >= n_drawers and not by.get("raw")
        wait_for(done, timeout, f"{n_drawers} processed drawers in {workspace}")

    def processed_drawer(self, workspace: str, content: str, timeout: float = 60) -> tuple[str, str, str]:
        """(id, wing, room) of the drawer holding ``content`` once the pipeline has processed it."""
        def ready() -> tuple[str, str, str] | None:
            rows = self.sql("SELECT id, wing, room, state FROM drawers WHERE workspace_id = %s AND content = %s",
                            (workspace, content))
            return (rows[0][0], rows[0][1], rows[0][2]) if rows and rows[0][3] == "processed" else None
        return wait_for(ready, timeout, f"the drawer of {content[:30]!r} to be processed")


def api_key_for(stack: Stack, workspace: str, name: str = "test") -> str:
    """A fresh API key of ``workspace``, created the way `palace apikey create` does (scoped transaction)."""
    from shared.db.apikeys import create_api_key
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    async def go() -> str:
        pool = await open_pool(stack.database_url, name="test-keys", max_size=1)
        try:
            async with workspace_tx(pool, workspace) as conn:
                return await create_api_key(conn, workspace, name)
        finally:
            await pool.close()

    return asyncio.run(go())


def wait_for(pred: Callable[[], T], timeout: float = 60, what: str = "condition",
             explain: Callable[[], str] | None = None) -> T:
    """Poll ``pred`` until it is truthy; on timeout, fail with ``explain()``'s text (logs, state) appended."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(0.2)


def stack_logs(devstack: Path, tail: int = 2_000) -> str:
    """The last characters of what `palace up` printed and of every service log under ``devstack``: what a
    failed start-up test shows, since the run that failed is usually gone by the time anyone looks."""
    parts = []
    for p in [devstack / "up.out", *sorted((devstack / "logs").glob("*.log"))]:
        if p.exists():
            parts.append(f"--- {p.name} ---\n{p.read_text(errors='replace')[-tail:]}")
    return "\n".join(parts) or f"(nothing logged under {devstack})"


def ws() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def session(workspace: str, session_id: str, texts: list[str], **kw: Any) -> dict[str, Any]:
    return {"workspace_id": workspace, "session_id": session_id, "agent_id": "agent-1", "user_id": "user-1",
            "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": t,
                          "created_at": "2026-11-01T10:00:00Z"} for i, t in enumerate(texts)],
            "started_at": "2026-11-01T10:00:00Z", "completed_at": "2026-11-01T10:30:00Z", "metadata": {}, **kw}


def analyze(conn: psycopg.Connection[Any], table: str) -> None:
    """``ANALYZE table`` in a savepoint (or its own transaction), run again when it loses a deadlock to an
    index maintain is building concurrently: ``CREATE INDEX CONCURRENTLY`` waits for the transactions
    older than it, and ANALYZE for the lock the build holds. Benign, and what an operator would do."""
    for attempt in range(5):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 4:
                raise
            time.sleep(0.5)


@contextmanager
def fresh_database(stack: Stack, prefix: str) -> Iterator[str]:
    """An empty database of its own on the stack's server (its URL), dropped afterwards: for a test whose
    subject is what a whole database holds (its migrations, its planner statistics)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(stack.database_url)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**info)
    finally:
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def restore(stack: Stack, workspace: str, drawer_id: str, *, actor: str = "operator") -> bool:
    """Undo a soft delete as an operator does (``restore_drawer``, audited as RESTORE); False if the drawer
    was not deleted."""
    from shared.db.drawer_admin import restore_drawer
    from shared.db.pool import open_pool
    from shared.db.tenancy import workspace_tx

    pool = await open_pool(stack.database_url, name="test-restore", max_size=1)
    try:
        async with workspace_tx(pool, workspace) as conn:
            return await restore_drawer(conn, workspace, drawer_id, actor=actor, event_id="test-restore")
    finally:
        await pool.close()
