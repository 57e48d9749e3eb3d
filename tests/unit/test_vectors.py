"""Vectors read back from PostgreSQL: pgvector hands them over as its own ``Vector`` type."""

from __future__ import annotations

import numpy as np
from pgvector import Vector

from shared.db.drawers import as_array


def test_as_array_converts_pgvector_vector() -> None:
    out = as_array(Vector([0.5, -1.0, 2.0]))
    assert out.dtype == np.float32 and out.tolist() == [0.5, -1.0, 2.0]


def test_as_array_passes_arrays_and_lists_through() -> None:
    assert as_array(np.array([1.0, 2.0])).dtype == np.float32
    assert as_array([3.0]).tolist() == [3.0]
