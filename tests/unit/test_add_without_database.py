"""An add needs NATS, not PostgreSQL: with the database down or slow, the text is still queued durably and
the answer is "accepted" (whether it was filed, deleted or forgotten before cannot be told then; ingest
checks forgets again). The check that tells it waits a bounded time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import shared.palace_ops as palace_ops
from shared.config import Settings
from shared.palace_ops import PalaceOps


class _Pool:
    def __init__(self, fail: BaseException | None, hang: bool = False) -> None:
        self.fail, self.hang = fail, hang

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        if self.hang:
            await asyncio.sleep(3600)  # a database that never answers
        assert self.fail is not None
        raise self.fail
        yield  # pragma: no cover


@pytest.mark.parametrize("pool", [_Pool(psycopg.OperationalError("connection refused")), _Pool(None, hang=True)],
                         ids=["down", "hanging"])
def test_an_add_is_queued_and_accepted_without_the_database(pool: _Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    published: list[Any] = []

    async def publish(broker: Any, settings: Settings, event: Any, **_: Any) -> bool:
        published.append(event)
        return False

    monkeypatch.setattr(palace_ops, "publish_event", publish)
    monkeypatch.setattr(palace_ops, "_ADD_CHECK_S", 0.3)
    ops = PalaceOps(Settings(), pool, None, None, None)  # type: ignore[arg-type]
    t0 = time.monotonic()
    acc = asyncio.run(ops.add_drawer("ws-1", "Alice moved the standup to 9:30 on Mondays.", wing="alice"))
    assert acc.status == "accepted" and acc.wing == "alice" and len(acc.drawer_ids) == 1
    assert [e.session_id for e in published] == [acc.session_id]
    assert time.monotonic() - t0 < 5


def test_a_failure_of_our_own_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    async def publish(*_: Any, **__: Any) -> bool:
        raise AssertionError("not published")

    monkeypatch.setattr(palace_ops, "publish_event", publish)
    ops = PalaceOps(Settings(), _Pool(ValueError("a bug")), None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(ops.add_drawer("ws-1", "Alice moved the standup to 9:30 on Mondays."))
