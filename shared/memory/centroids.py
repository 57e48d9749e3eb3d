"""Type centroids: phase 2 of classification.

A centroid is the mean embedding of the drawers the LLM labelled with one type. Only LLM labels
train it (a heuristic label would teach the centroid the heuristic's own mistakes), a type with
too few samples has no say, and a drawer is decided by its nearest centroid only above a cosine
gate: below it the centroids are not sure either and the LLM decides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["Centroid", "compute_centroids", "nearest_type", "source_hash"]


@dataclass(frozen=True)
class Centroid:
    memory_type: str
    vector: np.ndarray  # unit length
    sample_count: int


def source_hash(samples: Iterable[tuple[str, str]]) -> str:
    """A digest of the training set, (drawer id, type) pairs in any order: equal sets, equal hash,
    so a recompute over an unchanged set can be skipped."""
    h = hashlib.sha256()
    for did, t in sorted(samples):
        h.update(f"{did}\x1f{t}\x1e".encode())
    return h.hexdigest()


def compute_centroids(samples: Iterable[tuple[str, np.ndarray]]) -> list[Centroid]:
    """Mean unit vector per type from (type, embedding) samples."""
    by_type: dict[str, list[np.ndarray]] = {}
    for t, v in samples:
        by_type.setdefault(t, []).append(np.asarray(v, dtype=np.float32))
    out = []
    for t, vs in sorted(by_type.items()):
        m = np.mean(np.stack(vs), axis=0)
        out.append(Centroid(t, (m / (np.linalg.norm(m) or 1.0)).astype(np.float32), len(vs)))
    return out


def nearest_type(
    embedding: np.ndarray, centroids: Iterable[Centroid], *, min_cosine: float, min_samples: int
) -> tuple[str, float] | None:
    """The type of the nearest centroid with enough samples, when its cosine clears ``min_cosine``."""
    v = np.asarray(embedding, dtype=np.float32)
    v = v / (np.linalg.norm(v) or 1.0)
    best: tuple[str, float] | None = None
    for c in centroids:
        if c.sample_count < min_samples:
            continue
        cos = float(np.dot(v, c.vector))
        if best is None or cos > best[1]:
            best = (c.memory_type, cos)
    return best if best is not None and best[1] >= min_cosine else None
