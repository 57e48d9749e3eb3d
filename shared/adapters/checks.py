"""Validation of embedder output: a provider returning garbage must fail loudly, not poison the index."""

from __future__ import annotations

import numpy as np

from shared.ports import EmbeddingError

__all__ = ["check_and_normalize"]


def check_and_normalize(vectors: np.ndarray, expected_rows: int, dim: int) -> np.ndarray:
    """Check shape and finiteness, then L2-normalise rows (cosine == dot product afterwards)."""
    if vectors.ndim != 2 or vectors.shape != (expected_rows, dim):
        raise EmbeddingError(f"embedder returned shape {vectors.shape}, expected ({expected_rows}, {dim})")
    if not np.all(np.isfinite(vectors)):
        raise EmbeddingError("embedder returned NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise EmbeddingError("embedder returned an all-zero vector")
    return (vectors / norms).astype(np.float32)
