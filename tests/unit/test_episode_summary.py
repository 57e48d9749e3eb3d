"""The LLM episode summary's prompt and the strict reading of its answer (pure)."""

from __future__ import annotations

import json

import pytest

from shared.memory.episodes import SUMMARY_MAX_CHARS, parse_summary, summary_messages
from shared.memory.llm_labels import LlmParseError


def test_answer_in_a_think_block_and_a_fence_is_read() -> None:
    text = '<think>hmm {"summary": "no"}</think>\n```json\n{"summary": "  Alice and Bob  chose Postgres. "}\n```'
    assert parse_summary(text) == "Alice and Bob chose Postgres."


@pytest.mark.parametrize("text", ["Sure, a summary.", '{"summary": ""}', '{"summary": 3}', '{"items": []}', ""])
def test_an_answer_without_a_summary_is_a_parse_error(text: str) -> None:
    with pytest.raises(LlmParseError):
        parse_summary(text)


def test_an_overlong_summary_is_cut_at_a_word() -> None:
    out = parse_summary(json.dumps({"summary": "word " * 1000}))
    assert len(out) <= SUMMARY_MAX_CHARS and out.endswith("…") and "wor…" not in out


def test_a_long_session_keeps_its_most_important_turns_in_order() -> None:
    turns = [("Bob", f"small talk number {i} " * 20) for i in range(200)]
    turns[150] = ("Alice", "We decided to use PostgreSQL for billing; this is final and important.")
    msgs = summary_messages(turns)
    sent = json.loads(msgs[-1]["content"])["session"]
    assert len(json.dumps(sent)) < 40_000 < len(json.dumps(turns))
    assert any("PostgreSQL" in t["text"] for t in sent)
    short = summary_messages(turns[:3])
    assert [t["speaker"] for t in json.loads(short[-1]["content"])["session"]] == ["Bob"] * 3
