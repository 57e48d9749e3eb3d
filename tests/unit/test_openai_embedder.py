"""The OpenAI-compatible embedder against a local test server: batching, retries, garbage detection."""

from __future__ import annotations

import numpy as np
import pytest

from shared.adapters import build_embedder
from shared.adapters.openai_embedder import OpenAIEmbedder
from shared.config import Settings
from shared.ports import EmbeddingError
from tests.openai_stub import StubState, serve_stub


async def test_embeds_in_batches_and_normalises() -> None:
    state = StubState()
    with serve_stub(state) as url:
        emb = build_embedder(Settings(embed_base_url=url, embed_model="stub", embed_batch=4))
        assert isinstance(emb, OpenAIEmbedder)
        vecs = await emb.embed_documents([f"text number {i}" for i in range(10)])
        q = await emb.embed_query("text number 3")
        await emb.aclose()
    assert vecs.shape == (10, 384) and state.calls == 4  # 3 document batches + 1 query
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    assert int(np.argmax(vecs @ q)) == 3


async def test_transient_failures_are_retried() -> None:
    state = StubState(fail_remaining=2)
    with serve_stub(state) as url:
        emb = build_embedder(Settings(embed_base_url=url, embed_model="stub"))
        vecs = await emb.embed_documents(["hello there"])
        await emb.aclose()
    assert vecs.shape == (1, 384) and state.calls == 3


@pytest.mark.parametrize("mode", ["garbage_shape", "garbage_nan", "garbage_count", "fail"])
async def test_garbage_or_down_endpoint_raises(mode: str) -> None:
    state = StubState(mode=mode)
    with serve_stub(state) as url:
        emb = build_embedder(Settings(embed_base_url=url, embed_model="stub"))
        emb.config = emb.config.__class__(**{**emb.config.__dict__, "attempts": 2})  # type: ignore[union-attr]
        # A garbage answer is the endpoint's fault for good (EmbeddingError); a 500 is raised as the
        # transient error it is, so the consumer holds the message instead of failing it.
        import openai

        with pytest.raises(openai.InternalServerError if mode == "fail" else EmbeddingError):
            await emb.embed_documents(["hello there"])
        await emb.aclose()
    if mode == "fail":
        assert state.calls == 2, "a failing endpoint is tried the configured number of times"
