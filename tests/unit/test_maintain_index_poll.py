"""maintain looks for requested vector indexes every PALACE_VECTOR_INDEX_POLL_S, not once a sweep: until a
workspace past the size that asks for one has it, every search and every cluster event scans it exactly."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import services.maintain.indexes as indexes
from services._runtime import Deps
from shared.config import Settings


def test_requests_are_looked_for_every_poll_and_lexicons_once_a_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[float] = []
    lexicons: list[float] = []
    looked_five_times = asyncio.Event()

    async def build_wanted(deps: Any, holder: str) -> int:
        builds.append(asyncio.get_running_loop().time())
        if len(builds) >= 5:
            looked_five_times.set()
        return 0

    async def refresh_lexicons(deps: Any, holder: str) -> int:
        lexicons.append(asyncio.get_running_loop().time())
        return 0

    async def pending_wait_s(deps: Any) -> float:
        return 1.0  # a request waits

    monkeypatch.setattr(indexes, "pending_wait_s", pending_wait_s)
    monkeypatch.setattr(indexes, "build_wanted", build_wanted)
    monkeypatch.setattr(indexes, "refresh_lexicons", refresh_lexicons)
    settings = Settings(maintain_interval_s=3600.0, vector_index_poll_s=0.05)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(indexes.vector_index_loop(Deps(settings, "maintain", None, None), stop))  # type: ignore[arg-type]
        # Five looks at a 0.05 s poll take a quarter of a second; the deadline is for a loaded machine, and
        # still far below the hour a look on the sweep's interval would take.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(looked_five_times.wait(), 10)
        stop.set()
        await asyncio.wait_for(loop, 10)

    asyncio.run(go())
    assert len(builds) >= 5, f"looked for requests {len(builds)} times in 10 s at a 0.05 s poll"
    assert len(lexicons) == 1, "lexicons are recounted on the sweep's interval (an hour here)"
