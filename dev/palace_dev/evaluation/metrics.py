"""LoCoMo retrieval metrics, as defined in ../shared/bench/README.md.

* turn recall@k: share of a question's evidence dia_ids found among the top-k turns;
* session recall_any@k: 1 if any evidence session appears among the sessions of the top-k turns.

A system whose unit holds several turns is cut to its first k *turns* (units flattened in rank order),
so systems with different chunking are compared on the same footing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["QuestionResult", "Summary", "flatten_units", "session_of", "session_recall_any", "summarize",
           "turn_recall"]


def session_of(dia_id: str) -> str:
    """'D12:3' → '12'."""
    return dia_id[1:].split(":", 1)[0]


def flatten_units(units: Iterable[Sequence[str]]) -> list[str]:
    """Turns of ranked units, in rank order, first occurrence kept."""
    seen: dict[str, None] = {}
    for unit in units:
        for d in unit:
            seen.setdefault(d, None)
    return list(seen)


def turn_recall(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    if not evidence:
        raise ValueError("a question needs evidence")
    top = set(ranked[:k])
    return sum(1 for e in set(evidence) if e in top) / len(set(evidence))


def session_recall_any(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    top_sessions = {session_of(d) for d in ranked[:k]}
    return 1.0 if any(session_of(e) in top_sessions for e in evidence) else 0.0


@dataclass(frozen=True)
class QuestionResult:
    sample_id: str
    category: int
    evidence: tuple[str, ...]
    ranked: tuple[str, ...]
    latency_ms: float


@dataclass(frozen=True)
class Summary:
    questions: int
    turn_recall_5: float
    turn_recall_10: float
    session_any_5: float
    session_any_10: float
    p50_ms: float
    p95_ms: float
    per_category: dict[str, dict[str, float]]

    def as_json(self) -> dict[str, object]:
        """The top-level keys ``palace bench locomo --json`` promises, and nothing else."""
        return {
            "turn_recall@5": self.turn_recall_5, "turn_recall@10": self.turn_recall_10,
            "session_recall_any@5": self.session_any_5, "session_recall_any@10": self.session_any_10,
            "questions": self.questions, "search_p50_ms": self.p50_ms, "search_p95_ms": self.p95_ms,
            "per_category": self.per_category,
        }


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1])


def _scores(results: Sequence[QuestionResult]) -> dict[str, float]:
    n = len(results)
    return {
        "questions": n,
        "turn_recall@5": sum(turn_recall(r.ranked, r.evidence, 5) for r in results) / n,
        "turn_recall@10": sum(turn_recall(r.ranked, r.evidence, 10) for r in results) / n,
        "session_recall_any@5": sum(session_recall_any(r.ranked, r.evidence, 5) for r in results) / n,
        "session_recall_any@10": sum(session_recall_any(r.ranked, r.evidence, 10) for r in results) / n,
    }


def summarize(results: Sequence[QuestionResult]) -> Summary:
    """Averages over questions, overall and per LoCoMo category, plus latency percentiles."""
    if not results:
        raise ValueError("no results")
    overall = _scores(results)
    by_cat: dict[int, list[QuestionResult]] = defaultdict(list)
    for r in results:
        by_cat[r.category].append(r)
    lat = [r.latency_ms for r in results]
    return Summary(
        questions=len(results), turn_recall_5=overall["turn_recall@5"], turn_recall_10=overall["turn_recall@10"],
        session_any_5=overall["session_recall_any@5"], session_any_10=overall["session_recall_any@10"],
        p50_ms=_percentile(lat, 50), p95_ms=_percentile(lat, 95),
        per_category={str(c): _scores(rs) for c, rs in sorted(by_cat.items())},
    )
