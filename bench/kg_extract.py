"""Precision and recall of the offline entity/triple extractor against the hand labels.

    .venv/bin/python bench/kg_extract.py [--misses]

Runs ``shared.memory.relations.extract_graph`` over the 105 turns of LoCoMo-dev labelled in
``tests/data/kg_labels_locomo_dev.json`` (guide: ``tests/data/README.md``) and prints precision,
recall and F1 for entities (exact and lenient names) and triples (strict relation, and the
source/target pair alone), overall and for the conversations the extractor was tuned on versus
the two it was not (conv-42, conv-43: their misses were never read while tuning). Writes
bench/results/kg_extract.json. No servers: this is pure text processing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _common import REPO, console, machine_info, write_results
from rich.table import Table

LABELS = REPO / "tests" / "data" / "kg_labels_locomo_dev.json"
NOT_TUNED_ON = frozenset({"conv-42", "conv-43"})


def measure(path: Path = LABELS) -> dict[str, Any]:
    from shared.memory.kg_eval import evaluate_labels

    turns = json.loads(path.read_text())["turns"]
    t0 = time.perf_counter()
    overall, detail = evaluate_labels(turns)
    dt = time.perf_counter() - t0
    tuned, _ = evaluate_labels([t for t in turns if t["conversation"] not in NOT_TUNED_ON])
    held, _ = evaluate_labels([t for t in turns if t["conversation"] in NOT_TUNED_ON])
    return {"turns": len(turns), "seconds": round(dt, 4), "overall": overall.as_dict(),
            "tuned_on": tuned.as_dict(), "not_tuned_on": held.as_dict(), "detail": detail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--misses", action="store_true", help="print each turn whose prediction differs from its labels")
    args = ap.parse_args()
    res = measure()
    table = Table(title=f"offline extractor vs {res['turns']} hand-labelled LoCoMo-dev turns")
    for col in ("measure", "split", "precision", "recall", "F1", "hits / predicted / labelled"):
        table.add_column(col)
    for split in ("overall", "tuned_on", "not_tuned_on"):
        for k, v in res[split].items():
            table.add_row(k, split.replace("_", " "), f"{v['precision']:.3f}", f"{v['recall']:.3f}", f"{v['f1']:.3f}",
                          f"{v['true_pos']} / {v['predicted']} / {v['labelled']}")
    console.print(table)
    console.print(f"{res['turns']} turns extracted in {res['seconds'] * 1000:.1f} ms")
    if args.misses:
        for d in res["detail"]:
            if sorted(map(str, d["gold_triples"])) != sorted(map(str, d["triples"])):
                console.print(f"\n[bold]{d['conversation']} {d['dia_id']}[/] {d['text']}")
                console.print(f"  labelled {d['gold_entities']} {d['gold_triples']}")
                console.print(f"  found    {d['entities']} {d['triples']}")
    out = {k: v for k, v in res.items() if k != "detail"}
    write_results("kg_extract", {"machine": machine_info(), **out})


if __name__ == "__main__":
    main()
