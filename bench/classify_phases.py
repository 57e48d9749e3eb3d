"""Classification per phase on ../shared/bench/locomo-dev.json: throughput, share decided, accuracy.

    .venv/bin/python bench/classify_phases.py [--min-samples 5] [--llm-latency 0.2]   (make bench-classify)

- heuristic: every turn classified; accuracy on the hand-labelled turns (tests/data), overall and on
  the turns it decides alone (confidence >= PALACE_HEURISTIC_HIGH).
- centroid: turns embedded with the configured (local) embedder. Centroids are meant to be trained
  on LLM labels; with no LLM here, the hand labels of conv-26/30/41 stand in for them and the turns
  of conv-42/43 are scored (a held-out estimate of the phase with perfect teacher labels). The
  labelled sample is small, so ``--min-samples`` lowers the 50-sample rule for this estimate.
- llm: the cold path's own throughput over the labelled turns against the local OpenAI-compatible
  test server (tests/openai_stub.py) answering every call after a fixed latency, batched per
  workspace (PALACE_LLM_BATCH drawers a call) against one call per drawer. The stub is no model, so
  its labels are not scored; only with PALACE_LLM_BASE_URL set is a real model's accuracy measured.

Shares use the configured gates: high band → heuristic, middle band with a centroid hit → centroid,
the rest → LLM (or the heuristic when no LLM is configured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import REPO, console, load_locomo, machine_info, write_results
from shared.adapters import build_embedder
from shared.config import Settings
from shared.memory.centroids import compute_centroids, nearest_type
from shared.memory.classify import classify

LABELS = REPO / "tests" / "data" / "locomo_type_labels.json"
TRAIN = ("conv-26", "conv-30", "conv-41")


def _acc(pairs: list[tuple[str, str]]) -> float | None:
    return round(sum(a == b for a, b in pairs) / len(pairs), 3) if pairs else None


async def _llm_against_stub(s: Settings, items: list[tuple[str, str]], latency: float) -> dict[str, object]:
    """The LLM phase's throughput when every answer takes ``latency`` seconds: batched per workspace
    (``llm_batch`` drawers a call) and one call per drawer, through the real client and parser."""
    from shared.adapters.llm import LlmClient, Usage
    from shared.memory.cold_path import label_with_llm
    from tests.openai_stub import StubState, serve_stub

    state = StubState()
    state.chat.latency_s = latency
    out: dict[str, object] = {"server": "tests/openai_stub.py", "latency_s": latency, "drawers": len(items)}
    with serve_stub(state) as url:
        client = LlmClient(s.model_copy(update={"llm_base_url": url, "llm_model": "stub-chat", "llm_timeout_s": 30}))
        for name, batch in (("batched", s.llm_batch), ("per_drawer", 1)):
            usage: list[Usage] = []
            state.chat.calls = 0

            async def chat(m: list[dict[str, str]], u: list[Usage] = usage) -> str:
                return await client.chat(m, purpose="bench", usage=u)

            t0 = time.perf_counter()
            res = await label_with_llm(chat, items, batch=batch)
            dt = time.perf_counter() - t0
            out[name] = {"drawers_per_call": batch, "calls": state.chat.calls, "seconds": round(dt, 2),
                         "drawers_per_s": round(len(items) / dt, 1), "labelled": len(res.labels),
                         "errors": len(res.errors), "tokens_in": sum(u.tokens_in for u in usage),
                         "tokens_out": sum(u.tokens_out for u in usage)}
    b, p = out["batched"], out["per_drawer"]
    out["speedup"] = round(b["drawers_per_s"] / p["drawers_per_s"], 1)  # type: ignore[index]
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-samples", type=int, default=5)
    ap.add_argument("--llm-latency", type=float, default=0.2, help="Seconds the test server takes per answer.")
    args = ap.parse_args()
    s = Settings()
    turns, _ = load_locomo()
    labels = {(r["sample_id"], r["dia_id"]): r["label"] for r in json.loads(LABELS.read_text())["labels"]}
    texts = [t.text for t in turns]

    t0 = time.perf_counter()
    heur = [classify(x) for x in texts]
    heur_s = time.perf_counter() - t0

    emb = build_embedder(s)
    t0 = time.perf_counter()
    vecs = np.asarray(await emb.embed_documents(texts), dtype=np.float32)
    embed_s = time.perf_counter() - t0

    idx = {(t.conv, t.dia_id): i for i, t in enumerate(turns)}
    train = [(lab, vecs[idx[k]]) for k, lab in labels.items() if k[0] in TRAIN]
    cents = compute_centroids(train)
    t0 = time.perf_counter()
    hits = [nearest_type(v, cents, min_cosine=s.centroid_min_cosine, min_samples=args.min_samples) for v in vecs]
    cent_s = time.perf_counter() - t0

    band = ["high" if h.confidence >= s.heuristic_high else "mid" if h.confidence >= s.heuristic_low else "low"
            for h in heur]
    phase = ["heuristic" if b == "high" else "centroid" if b == "mid" and hits[i] else "llm"
             for i, b in enumerate(band)]
    n = len(turns)
    share = {p: round(phase.count(p) / n, 3) for p in ("heuristic", "centroid", "llm")}

    lab_items = [(k, lab, idx[k]) for k, lab in labels.items()]
    heur_all = [(heur[i].memory_type, lab) for _, lab, i in lab_items]
    heur_own = [(heur[i].memory_type, lab) for _, lab, i in lab_items if band[i] == "high"]
    held = [(k, lab, i) for k, lab, i in lab_items if k[0] not in TRAIN]
    cent_mid = [(hits[i][0], lab) for _, lab, i in held if band[i] == "mid" and hits[i]]
    cent_any = [(hits[i][0], lab) for _, lab, i in held if hits[i]]
    cent_nearest = [(nearest_type(vecs[i], cents, min_cosine=-1, min_samples=args.min_samples)[0], lab)
                    for _, lab, i in held]
    final = [(hits[i][0] if phase[i] == "centroid" else heur[i].memory_type, lab) for _, lab, i in lab_items]

    llm_res: dict[str, object] = {"measured": False, "why": "PALACE_LLM_BASE_URL not set"}
    if s.llm_base_url:
        from shared.adapters.llm import LlmClient, Usage
        from shared.memory.cold_path import label_with_llm

        client, usage = LlmClient(s), []  # type: ignore[var-annotated]
        items = [(f"{k[0]}|{k[1]}", turns[i].text) for k, _, i in lab_items]

        async def chat(m: list[dict[str, str]]) -> str:
            u: list[Usage] = usage
            return await client.chat(m, purpose="bench", usage=u)

        t0 = time.perf_counter()
        res = await label_with_llm(chat, items, batch=s.llm_batch)
        llm_s = time.perf_counter() - t0
        got = [(res.labels[f"{k[0]}|{k[1]}"].memory_type, lab) for k, lab, _ in lab_items
               if f"{k[0]}|{k[1]}" in res.labels]
        llm_res = {"measured": True, "model": s.llm_model, "accuracy": _acc(got), "labelled": len(got),
                   "errors": len(res.errors), "drawers_per_s": round(len(items) / llm_s, 2),
                   "tokens_in": sum(u.tokens_in for u in usage), "tokens_out": sum(u.tokens_out for u in usage)}

    stub_items = [(f"{k[0]}|{k[1]}", turns[i].text) for k, _, i in lab_items]
    llm_stub = await _llm_against_stub(s, stub_items, args.llm_latency)

    out = {
        "machine": machine_info(), "turns": n, "labelled": len(labels),
        "gates": {"heuristic_low": s.heuristic_low, "heuristic_high": s.heuristic_high,
                  "centroid_min_cosine": s.centroid_min_cosine, "centroid_min_samples_for_estimate": args.min_samples},
        "share": share,
        "heuristic": {"drawers_per_s": round(n / heur_s), "accuracy_all_labelled": _acc(heur_all),
                      "accuracy_where_it_decides": _acc(heur_own), "decides_labelled": len(heur_own)},
        "centroid": {"embed_model": s.embed_model, "embed_drawers_per_s": round(n / embed_s, 1),
                     "nearest_drawers_per_s": round(n / cent_s),
                     "train": {c.memory_type: c.sample_count for c in cents},
                     "held_out_labelled": len(held), "accuracy_mid_band_hits": _acc(cent_mid),
                     "mid_band_hits": len(cent_mid), "accuracy_any_hit": _acc(cent_any), "hits": len(cent_any),
                     "accuracy_nearest_no_gate": _acc(cent_nearest)},
        "llm": llm_res,
        "llm_stub": llm_stub,
        "pipeline_without_llm_accuracy": _acc(final),
    }
    path = write_results("classify_phases", out)
    console.print_json(json.dumps(out))
    console.print(f"written {path}")


if __name__ == "__main__":
    asyncio.run(main())
