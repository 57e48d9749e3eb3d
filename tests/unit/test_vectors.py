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


async def test_hash_embedder_is_deterministic_unit_length_and_lexical() -> None:
    from shared.adapters.hash_embedder import HashEmbedder

    e = HashEmbedder(384)
    docs = await e.embed_documents(["We moved the database to Postgres.", "we MOVED the database to postgres",
                                    "Bananas are yellow."])
    assert docs.shape == (3, 384) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert float(docs[0] @ docs[1]) > 0.99 and abs(float(docs[0] @ docs[2])) < 0.5
    assert np.array_equal(await e.embed_query("Bananas are yellow."), docs[2])


def test_a_vector_literal_gives_back_every_float32_exactly() -> None:
    """Search sends the query vector as text (shared.db.search.vector_literal): nine significant digits,
    read back as float32 as pgvector's strtof does, must be the same vector, tiny and huge values
    included."""
    from shared.db.search import vector_literal

    rng = np.random.default_rng(7)
    for v in (rng.standard_normal(384).astype(np.float32),
              np.array([1e-38, -3.4028235e38, 1.1754944e-38, -0.0, 1 / 3, 0.1, 7.0, 1e-7], dtype=np.float32),
              np.frombuffer(rng.integers(0, 2**32, 2000, dtype=np.uint32).astype(np.uint32).tobytes(), np.float32)):
        v = v[np.isfinite(v)]
        text = vector_literal(v)
        assert text.startswith("[") and text.endswith("]")
        back = np.array(text[1:-1].split(","), dtype=np.float64).astype(np.float32)
        assert np.array_equal(back.view(np.uint32), v.view(np.uint32))


def test_an_awaited_index_is_looked_for_again_sooner_than_a_settled_answer() -> None:
    from shared.db.vector_indexes import recheck_after

    # Past the size that asks for an index, and not ready yet: every event scans it exactly until the
    # stage notices the build, so it asks again at maintain's poll.
    assert recheck_after(5_001, False, 5_000, 60.0, 5.0) == 5.0
    # Settled answers: ready, or small enough to scan exactly.
    assert recheck_after(5_001, True, 5_000, 60.0, 5.0) == 60.0
    assert recheck_after(4_000, False, 5_000, 60.0, 5.0) == 60.0
    assert recheck_after(5_000, False, 5_000, 60.0, 5.0) == 60.0
