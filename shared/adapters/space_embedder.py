"""The embedder of the database's active embedding space, followed while the process runs.

``palace reembed`` switches the space under running services (migration 0032). A service that kept
embedding with the model its settings name would then write vectors of the old space into the new
columns, and search would compare a query of one space with drawers of another. So every process
asks the database which space is active (at most every ``PALACE_EMBED_SPACE_CHECK_S``, and at once
when a statement finds a vector of the wrong dimension) and builds that space's embedder; its
settings only describe the first space and hold the credentials.

A caller that uses one embedder for several steps (look the cache up by model name, embed, save
under that name) takes it once with :func:`pinned`, so a switch between its steps cannot mix two
spaces in one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg_pool import AsyncConnectionPool

from shared.adapters import build_embedder
from shared.config import Settings
from shared.db.embedding_spaces import Space, SpaceTarget, active_space
from shared.logging import get_logger
from shared.ports import Embedder

__all__ = ["SpaceEmbedder", "SpaceSwitched", "embedder_for", "pin_space", "pinned"]

log = get_logger("palace.embedding_space")
_CLOSE_AFTER_S = 60.0  # an embedder swapped out may still serve calls already under way


class SpaceSwitched(RuntimeError):
    """The active embedding space changed while a batch embedded in the former one: what it computed
    belongs to a space whose vectors are no longer in the ``embedding`` columns. The batch is rolled back
    and runs again in the new space."""


def embedder_for(settings: Settings, target: SpaceTarget | None) -> Embedder:
    """The embedder of a space: the settings' own for the first space (no target recorded)."""
    if target is None:
        return build_embedder(settings)
    return build_embedder(settings.model_copy(update={
        "embed_provider": target.provider, "embed_model": target.model, "embed_dim": target.dim,
        "embed_base_url": target.base_url,
    }))


class SpaceEmbedder:
    """An :class:`~shared.ports.Embedder` that delegates to the active space's embedder."""

    def __init__(self, settings: Settings, pool: AsyncConnectionPool, check_s: float | None = None) -> None:
        self._settings = settings
        self._pool = pool
        self._check_s = settings.embed_space_check_s if check_s is None else check_s
        self._current: Embedder | None = None
        self._target: SpaceTarget | None = None
        self._space_id: str | None = None  # the space the current embedder belongs to (None: not known)
        self._checked = float("-inf")
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, settings: Settings, pool: AsyncConnectionPool) -> SpaceEmbedder:
        """Read the active space and build (and warm up) its embedder."""
        e = cls(settings, pool)
        await e.refresh(force=True)
        return e

    @property
    def current(self) -> Embedder:
        if self._current is None:
            self._current = embedder_for(self._settings, None)
        return self._current

    @property
    def model_name(self) -> str:  # type: ignore[override]
        return self.current.model_name

    @property
    def dim(self) -> int:  # type: ignore[override]
        return self.current.dim

    async def _read_space(self) -> Space | None:
        async with self._pool.connection() as conn, conn.transaction():
            return await active_space(conn)

    async def refresh(self, *, force: bool = False) -> Embedder:
        """The active space's embedder, re-reading which space that is when the last look is old."""
        if not force and self._current is not None and time.monotonic() - self._checked < self._check_s:
            return self._current
        async with self._lock:
            if not force and self._current is not None and time.monotonic() - self._checked < self._check_s:
                return self._current
            try:
                space = await self._read_space()
            except Exception as e:  # the database is down: keep embedding in the space we know
                log.warning("embedding_space_unknown", error=repr(e)[:300])
                return self.current
            finally:
                self._checked = time.monotonic()
            target = space.target if space is not None else None
            space_id = space.id if space is not None else None
            if self._current is not None and target == self._target:
                self._space_id = space_id
                return self._current
            new = embedder_for(self._settings, target)
            warm = getattr(new, "warm_up", None)
            if warm is not None:
                await warm()
            old, self._current, self._target, self._space_id = self._current, new, target, space_id
            log.info("embedding_space_active", space=space.id if space else None, model=new.model_name, dim=new.dim)
            if target is None and space is not None and space.dim != new.dim:
                log.warning("embedding_space_dimension_differs", configured=new.dim, database=space.dim)
            if old is not None:
                task = asyncio.create_task(self._close_later(old))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            return new

    @staticmethod
    async def _close_later(old: Embedder) -> None:
        await asyncio.sleep(_CLOSE_AFTER_S)
        with contextlib.suppress(Exception):
            await old.aclose()

    async def warm_up(self) -> None:
        await self.refresh()

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return await (await self.refresh()).embed_documents(texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return await (await self.refresh()).embed_query(text)

    async def aclose(self) -> None:
        for t in list(self._closing):
            t.cancel()
        if self._current is not None:
            await self._current.aclose()


async def pin_space(embedder: Any) -> tuple[Any, str | None]:
    """``pinned(embedder, force=True)`` and the id of the space its vectors belong to (None when not known:
    an embedder that does not follow the active space, or a database without spaces), read together."""
    if isinstance(embedder, SpaceEmbedder):
        current = await embedder.refresh(force=True)
        return current, embedder._space_id  # read with it: no other task runs between the two
    return embedder, None


async def pinned(embedder: Any, *, force: bool = False) -> Any:
    """The concrete embedder to use for one unit of work (itself unless it follows the active space)."""
    if isinstance(embedder, SpaceEmbedder):
        return await embedder.refresh(force=force)
    return embedder
