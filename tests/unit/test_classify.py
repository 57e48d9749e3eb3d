"""Heuristic classifier: types, confidence and importance within their ranges."""

import pytest

from shared.memory.classify import MEMORY_TYPES, classify


@pytest.mark.parametrize(("text", "expected"), [
    ("We decided to use PostgreSQL instead of MongoDB because of transactions.", "decision"),
    ("I really prefer dark mode; my favourite editor theme is Solarized.", "preference"),
    ("Finally shipped the v2 release and we launched it to everyone!", "milestone"),
    ("The server crashes with a timeout error; the root cause is a connection leak.", "problem"),
    ("I feel so anxious and stressed about the interview.", "emotional"),
    ("My sister lives in Boston and works as a nurse.", "fact"),
    ("Remind me to send the report by Friday, it's a deadline.", "task"),
    ("I fixed the bug, it works now, so happy!", "milestone"),
])
def test_types(text: str, expected: str) -> None:
    assert classify(text).memory_type == expected


@pytest.mark.parametrize("text", ["", "The weather was nice.", "x" * 900, "bug " * 200])
def test_ranges(text: str) -> None:
    c = classify(text)
    assert c.memory_type in MEMORY_TYPES
    assert 0.0 <= c.confidence <= 1.0
    assert 0.0 <= c.importance <= 5.0


def test_decisions_outrank_chatter() -> None:
    assert classify("We decided to migrate to Kubernetes; the trade-off is complexity.").importance > classify(
        "The weather was nice.").importance


def test_longer_evidence_raises_confidence() -> None:
    short = classify("We decided to use Redis.")
    long = classify("We decided to use Redis. " + "It handles our caching needs and the latency is fine. " * 6)
    assert long.confidence > short.confidence
