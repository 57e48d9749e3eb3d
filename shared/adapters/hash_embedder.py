"""A lexical embedder at almost no cost: the signed feature-hashing trick over word unigrams and bigrams.

Why it exists: to measure the pipeline itself (``bench/pipeline.py``) the model must cost nothing, and a
machine without the model's CPU budget may still want a working, deterministic embedder. Its vectors
are real — texts sharing words are near, the rest near-orthogonal — but carry no meaning beyond the
words, so recall quality is the full-text path's. Select it with ``PALACE_EMBED_PROVIDER=hash``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np

from shared.ports import EmbeddingError

__all__ = ["HashEmbedder"]

_WORD = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """Deterministic: the same text gives the same vector in every process and on every machine."""

    def __init__(self, dim: int) -> None:
        if dim < 8:
            raise ValueError("dimension must be at least 8")
        self.dim = dim
        self.model_name = f"hash-{dim}"

    def _vector(self, text: str) -> np.ndarray:
        words = [w.lower() for w in _WORD.findall(text)]
        grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        v = np.zeros(self.dim, dtype=np.float32)
        for g in grams or [text]:
            h = int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        n = float(np.linalg.norm(v))
        if n == 0.0:  # every gram cancelled out: fall back to one deterministic axis
            v[int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % self.dim] = 1.0
            n = 1.0
        return v / n

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            raise EmbeddingError("no texts to embed")
        return np.stack([self._vector(t) for t in texts])

    async def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)

    async def aclose(self) -> None:
        return None
