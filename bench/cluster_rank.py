"""Cluster's in-process ranking of an event's drawers (``shared.memory.neighbours.WorkspaceVectors.rank``:
the near-duplicate twins sharing a wording band, and the nearest neighbours, among every held drawer filed
before each), today's code beside the code at ``--before-ref``, alternating, on the same held workspace.

Random unit vectors (384 dimensions) stand in for embeddings: the cost is a matrix product and array
passes over the workspace, which do not depend on what the vectors say; a tenth of the drawers share a
wording band with the queries, as near-duplicates do. Both versions must return the same rankings.

    .venv/bin/python bench/cluster_rank.py [--sizes 1000,5000,10000,20000] [--rounds 7] [--before-ref REF]

Prints ms per event (ten drawers) per workspace size; writes bench/results/cluster_rank.json.
"""

from __future__ import annotations

import argparse
import time
from types import ModuleType
from typing import Any

import numpy as np
from _common import console, machine_info, module_at, percentiles, prepare_process, write_results
from rich.table import Table

BEFORE_REF = "9f4a39b"  # the last commit before the ranking's layout and band-candidate changes
DIMS = 384


def load_before(ref: str) -> ModuleType:
    """``shared.memory.neighbours`` as it was at ``ref`` (imports resolve against today's tree)."""
    return module_at(ref, "shared/memory/neighbours.py", "neighbours_before")


def measure(size: int, rounds: int, versions: dict[str, ModuleType], rng: np.random.Generator) -> dict[str, Any]:
    from shared.memory.dedup import BANDS

    rows = [(f"{i:032x}", rng.normal(size=DIMS).astype(np.float32), [int(b) for b in rng.integers(0, 2**40, BANDS)],
             i) for i in range(size)]
    for i in range(0, size, 10):  # near-duplicates of the last drawer: they share its first band
        rows[i][2][0] = rows[-1][2][0]
    held = {}
    for name, mod in versions.items():
        wv = mod.WorkspaceVectors(DIMS)
        wv.apply([mod.Change(id=d, vector=v, bands=b, filed_us=f) for d, v, b, f in rows], (0, ()), full=True)
        held[name] = wv
    queries = [(d, v, b) for d, v, b, _ in rows[-10:]]
    answers = {name: [(r.twins, r.near) for r in wv.rank(queries, 5)] for name, wv in held.items()}
    assert answers["before"] == answers["now"], "the two versions rank differently"
    ms: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(rounds):
        for name, wv in held.items():
            t0 = time.perf_counter()
            for _ in range(10):
                wv.rank(queries, 5)
            ms[name].append((time.perf_counter() - t0) / 10 * 1000)
    return {"drawers": size, "ms_per_event": {name: percentiles(v) for name, v in ms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000,10000,20000")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before-ref", default=BEFORE_REF)
    args = ap.parse_args()
    prepare_process()
    from threadpoolctl import threadpool_limits

    import shared.memory.neighbours as now

    threadpool_limits(1, user_api="blas")  # as the cluster service runs it
    versions = {"before": load_before(args.before_ref), "now": now}
    rng = np.random.default_rng(0)
    runs = [measure(int(n), args.rounds, versions, rng) for n in args.sizes.split(",")]
    t = Table(title=f"ranking one event's ten drawers in the cluster process: median ms ({args.before_ref} vs now)")
    for col in ("held drawers", "before", "now", "before ÷ now"):
        t.add_column(col, justify="right")
    for r in runs:
        b, n = r["ms_per_event"]["before"]["p50"], r["ms_per_event"]["now"]["p50"]
        t.add_row(f"{r['drawers']:,}", f"{b:.2f}", f"{n:.2f}", f"{b / n:.2f}×")
    console.print(t)
    path = write_results("cluster_rank", {"bench": "cluster_rank", "config": vars(args), "runs": runs,
                                          "machine": machine_info()})
    console.print(f"results: {path}")
    last = runs[-1]["ms_per_event"]
    print(f"cluster_rank drawers={runs[-1]['drawers']} before_p50_ms={last['before']['p50']:.2f} "
          f"now_p50_ms={last['now']['p50']:.2f}")


if __name__ == "__main__":
    main()
