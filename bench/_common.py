"""Shared plumbing of the benchmarks: where the stack lives, the LoCoMo data, results files, stats.

Every bench runs its own embedded stack under ``.devstack-bench`` so that a measurement never
disturbs (or is disturbed by) the developer's ``.devstack`` or the tests' ``.devstack-test``;
``PALACE_DATABASE_URL`` / ``PALACE_NATS_URL`` still win when set, as everywhere in Palace.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
BENCH_STACK = REPO / ".devstack-bench"
RESULTS = REPO / "bench" / "results"
CACHE = RESULTS / ".cache"
LOCOMO_DEV = Path(os.environ.get("PALACE_BENCH_LOCOMO", REPO.parent / "shared" / "bench" / "locomo-dev.json"))

console = Console()

__all__ = [
    "BENCH_STACK",
    "CACHE",
    "LOCOMO_DEV",
    "REPO",
    "RESULTS",
    "Question",
    "Turn",
    "bench_settings",
    "console",
    "free_port_block",
    "load_locomo",
    "machine_info",
    "percentiles",
    "prepare_process",
    "write_results",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One LoCoMo dialogue turn (text verbatim)."""

    conv: str
    session: str
    dia_id: str
    speaker: str
    text: str


@dataclass(frozen=True, slots=True)
class Question:
    conv: str
    question: str
    category: int


def load_locomo(path: Path = LOCOMO_DEV) -> tuple[list[Turn], list[Question]]:
    """All turns (conversation order) and all questions of the LoCoMo dev split."""
    if not path.exists():
        raise SystemExit(f"LoCoMo data not found at {path} (set PALACE_BENCH_LOCOMO)")
    data = json.loads(path.read_text())
    turns: list[Turn] = []
    questions: list[Question] = []
    for conv in data:
        cid = conv["sample_id"]
        for sess in conv["sessions"]:
            for t in sess["turns"]:
                turns.append(Turn(cid, sess["session_id"], t["dia_id"], t["speaker"], t["text"]))
        for q in conv["questions"]:
            questions.append(Question(cid, q["question"], int(q["category"])))
    return turns, questions


def bench_settings(**overrides: Any) -> Any:
    """Settings from the environment, but with the bench's own embedded stack directory."""
    from shared.config import Settings

    return Settings(devstack_dir=BENCH_STACK, **overrides)


def prepare_process() -> None:
    """Run from the repository root (services are spawned as ``python -m services.x``), keep
    library logs quiet, and turn SIGTERM into KeyboardInterrupt so ``finally`` blocks stop what
    the bench started even when it is killed politely."""
    os.chdir(REPO)
    from shared.logging import configure_logging

    configure_logging(os.environ.get("PALACE_BENCH_LOG_LEVEL", "WARNING"), json=False)

    def _term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)


def free_port_block(n: int, start: int = 19100, stop: int = 29000) -> int:
    """First port p such that p .. p+n-1 are all free on 127.0.0.1 (service metrics ports are
    base + index, so a block is needed, not one port)."""
    for base in range(start, stop, n):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no block of {n} free ports in {start}..{stop}")


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size),
    }


def machine_info() -> dict[str, Any]:
    """What a reader needs to compare two results files: cores, load, commit."""
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=5, check=False).stdout.strip()
    return {
        "cpus": os.cpu_count(), "loadavg_1m_5m_15m": list(os.getloadavg()), "python": platform.python_version(),
        "platform": platform.platform(), "commit": commit, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` atomically (the ``.tmp`` is git-ignored)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(out)
    return out
