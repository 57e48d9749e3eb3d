"""The search path's query-embedding cache is per workspace: shared between tenants, a fast answer told
one that another had just searched for the very same words."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from shared.recall import Recaller


class CountingEmbedder:
    model_name = "count"
    dim = 4

    def __init__(self) -> None:
        self.calls = 0

    async def embed_query(self, text: str) -> np.ndarray:
        self.calls += 1
        return np.ones(4, dtype=np.float32) / 2

    async def embed_documents(self, texts: list[str]) -> list[np.ndarray]:
        return [await self.embed_query(t) for t in texts]


def test_a_workspace_never_gets_another_workspaces_cached_query() -> None:
    emb = CountingEmbedder()
    rec = Recaller(pool=None, embedder=emb)  # type: ignore[arg-type]

    async def go() -> list[Any]:
        return [await rec._embed("who owns the Orion launch?", w) for w in ("acme", "acme", "globex")]

    vecs = asyncio.run(go())
    assert emb.calls == 2, "once per workspace: the second acme search is served from the cache"
    assert all(v is not None for v in vecs)
