"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, TEI, Ollama, LiteLLM ...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from shared.adapters.checks import check_and_normalize
from shared.config import Settings
from shared.ports import EmbeddingError

__all__ = ["OpenAIEmbedder", "OpenAIEmbedderConfig"]


@dataclass(frozen=True)
class OpenAIEmbedderConfig:
    base_url: str | None
    api_key: str | None
    model: str
    dim: int
    batch_size: int = 64
    timeout_s: float = 30.0
    attempts: int = 4

    @classmethod
    def from_settings(cls, s: Settings) -> OpenAIEmbedderConfig:
        return cls(
            base_url=s.embed_base_url, api_key=s.embed_api_key, model=s.embed_model, dim=s.embed_dim,
            batch_size=s.embed_batch, timeout_s=s.embed_timeout_s,
        )


class OpenAIEmbedder:
    """Remote embeddings with one declarative retry policy (tenacity) for transient failures.

    After the retries are spent the error propagates; the consumer then NAKs with backoff and,
    past ``max_deliver``, dead-letters. Drawers stay raw in the database meanwhile: nothing is lost.
    """

    def __init__(self, config: OpenAIEmbedderConfig, client: Any | None = None) -> None:
        """
        Args:
            config: endpoint, model and dimension.
            client: a prepared ``openai.AsyncOpenAI`` (tests), else one is built from config.
        """
        if client is None:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(
                base_url=config.base_url, api_key=config.api_key or "not-needed",
                timeout=config.timeout_s, max_retries=0,
            )
        self.client = client
        self.config = config
        self.model_name = config.model
        self.dim = config.dim

    async def _call(self, texts: list[str]) -> np.ndarray:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.config.attempts),
            wait=wait_exponential_jitter(multiplier=0.5, max=8),
            retry=retry_if_exception_type(Exception),
            reraise=True,
        ):
            with attempt:
                resp = await self.client.embeddings.create(model=self.config.model, input=texts)
                data = sorted(resp.data, key=lambda d: d.index)
                if len(data) != len(texts):
                    raise EmbeddingError(f"endpoint returned {len(data)} embeddings for {len(texts)} inputs")
                arr = np.asarray([d.embedding for d in data], dtype=np.float32)
                return check_and_normalize(arr, len(texts), self.dim)
        raise AssertionError("unreachable")

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [
            await self._call(list(texts[i : i + self.config.batch_size]))
            for i in range(0, len(texts), self.config.batch_size)
        ]
        return np.vstack(parts)

    async def embed_query(self, text: str) -> np.ndarray:
        return (await self._call([text]))[0]

    async def aclose(self) -> None:
        await self.client.close()
