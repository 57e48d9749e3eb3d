"""LoCoMo metric code on hand-made rankings whose right answers are known."""

from datetime import UTC, datetime

import pytest

from palace_dev.evaluation.locomo import Conversation, Question, parse_locomo_time, to_events
from palace_dev.evaluation.metrics import (
    QuestionResult,
    flatten_units,
    session_of,
    session_recall_any,
    summarize,
    turn_recall,
)


def test_session_of() -> None:
    assert session_of("D12:3") == "12" and session_of("D1:10") == "1"


def test_turn_recall_counts_evidence_in_top_k() -> None:
    ranked = ["D1:1", "D2:4", "D1:3", "D3:1"]
    assert turn_recall(ranked, ["D1:3"], 2) == 0.0
    assert turn_recall(ranked, ["D1:3"], 3) == 1.0
    assert turn_recall(ranked, ["D1:3", "D3:1"], 3) == 0.5
    assert turn_recall(ranked, ["D1:3", "D1:3"], 3) == 1.0  # duplicates in evidence count once
    with pytest.raises(ValueError):
        turn_recall(ranked, [], 3)


def test_session_recall_any() -> None:
    ranked = ["D1:1", "D2:4", "D1:3"]
    assert session_recall_any(ranked, ["D2:9"], 2) == 1.0  # same session, different turn
    assert session_recall_any(ranked, ["D3:1", "D1:7"], 1) == 1.0  # any evidence session suffices
    assert session_recall_any(ranked, ["D3:1"], 3) == 0.0


def test_units_flatten_in_rank_order_and_cut_in_turns() -> None:
    units = [["D1:1", "D1:2"], ["D2:1"], ["D1:2", "D1:3"]]
    ranked = flatten_units(units)
    assert ranked == ["D1:1", "D1:2", "D2:1", "D1:3"]
    assert turn_recall(ranked, ["D1:3"], 3) == 0.0  # k counts turns, not units


def test_summary_overall_and_per_category() -> None:
    results = [
        QuestionResult("c", 1, ("D1:1",), ("D1:1", "D2:1"), 10.0),
        QuestionResult("c", 1, ("D2:2",), ("D1:1", "D2:1"), 20.0),
        QuestionResult("c", 4, ("D3:1", "D3:2"), ("D3:2", *tuple(f"D9:{i}" for i in range(20))), 30.0),
    ]
    s = summarize(results)
    assert s.questions == 3
    assert s.turn_recall_10 == pytest.approx((1 + 0 + 0.5) / 3)
    assert s.session_any_5 == pytest.approx(1.0)  # D2 appears for the second question
    assert s.per_category["1"]["turn_recall@10"] == pytest.approx(0.5)
    assert s.per_category["4"]["questions"] == 1
    assert s.p50_ms == pytest.approx(20.0)
    assert set(s.as_json()) == {"turn_recall@5", "turn_recall@10", "session_recall_any@5", "session_recall_any@10",
                                "questions", "search_p50_ms", "search_p95_ms", "per_category"}


def test_locomo_times_and_events() -> None:
    assert parse_locomo_time("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert parse_locomo_time("not a date") is None
    conv = Conversation("c", [{"session_id": "session_1", "date_time": "10:00 am on 1 June, 2023",
                               "turns": [{"dia_id": "D1:1", "speaker": "Ann", "text": "I adopted a cat."},
                                         {"dia_id": "D1:2", "speaker": "Bo", "text": "What is its name?"}]}],
                        [Question(0, "q", "a", ("D1:1",), 4)])
    (ev,) = to_events(conv, "w")
    assert [m["metadata"]["dia_id"] for m in ev["messages"]] == ["D1:1", "D1:2"]
    assert [m["role"] for m in ev["messages"]] == ["user", "assistant"]
    assert ev["messages"][0]["name"] == "Ann" and ev["started_at"].startswith("2023-06-01T10:00")
