"""Ports: the interfaces domain code depends on. Adapters in ``shared.adapters`` implement them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Embedder", "EmbeddingError"]


class EmbeddingError(RuntimeError):
    """The embedder failed or returned something unusable (wrong shape, NaN, empty)."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors of a fixed dimension."""

    model_name: str
    dim: int

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of stored content, shape (len(texts), dim)."""
        ...

    async def embed_query(self, text: str) -> np.ndarray:
        """Embedding of a search query, shape (dim,)."""
        ...

    async def aclose(self) -> None:
        """Release resources (HTTP clients, threads)."""
        ...
