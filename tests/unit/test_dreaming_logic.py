"""Dreaming's pure parts: the strict reading of an LLM synthesis and the extractive fallback."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.memory.dreaming import EpisodeIn, extractive, parse_synthesis, run_id, session_event
from shared.memory.llm_labels import LlmParseError


def ep(i: int, topics: list[str]) -> EpisodeIn:
    return EpisodeIn(f"e{i}", f"s{i}", f"summary {i}", f"abstract {i}", topics, datetime(2026, 10, i, tzinfo=UTC))


def test_a_synthesis_keeps_what_is_valid_and_says_what_it_dropped() -> None:
    answer = ('<think>hmm {"memories": []}</think>```json\n{"memories": ['
              '{"content": "  Prefers  tea. ", "kind": "preference", "episode_ids": ["e1"]},'
              '{"content": "prefers tea.", "kind": "preference"},'
              '{"content": "", "kind": "fact"}, "not an object",'
              '{"content": "Works on Orion.", "kind": "weird", "episode_ids": ["e9", "e2"]}]}\n```')
    mems, warnings = parse_synthesis(answer, ["e1", "e2"])
    assert [(m.content, m.kind, m.episode_ids) for m in mems] == [
        ("Prefers tea.", "preference", ["e1"]), ("Works on Orion.", "fact", ["e2"])]
    assert warnings == ["memory 2: no content", "memory 3: no content", "memory 4: unknown episode ids dropped"]
    with pytest.raises(LlmParseError):
        parse_synthesis("These sessions were about tea.", ["e1"])
    many = '{"memories": [' + ",".join(f'{{"content": "fact {i}"}}' for i in range(30)) + "]}"
    mems, warnings = parse_synthesis(many, ["e1"])
    assert len(mems) == 20 and warnings[-1].startswith("more than 20")


def test_the_extractive_note_spans_the_sessions_with_recurring_topics() -> None:
    (m,) = extractive([ep(1, ["kyoto", "trip"]), ep(3, ["kyoto", "tea"]), ep(2, ["trip", "kyoto"])])
    assert m.content.splitlines() == [
        "Consolidated memory of 3 sessions (2026-10-01 to 2026-10-03).", "Recurring topics: kyoto, trip.",
        "- 2026-10-01: abstract 1", "- 2026-10-03: abstract 3", "- 2026-10-02: abstract 2"]
    assert m.episode_ids == ["e1", "e3", "e2"] and extractive([]) == []


def test_a_run_is_one_session_whatever_order_its_episodes_come_in() -> None:
    assert run_id("w", "a", "u", ["e2", "e1"]) == run_id("w", "a", "u", ["e1", "e2"])
    assert run_id("w", "a", "u", ["e1", "e2"]) != run_id("w", "a", "", ["e1", "e2"])
    at = datetime(2026, 11, 1, tzinfo=UTC)
    (m,) = extractive([ep(1, [])])
    one, two = (session_event("w", "r1", "a", "", [m], "extractive", at=at) for _ in range(2))
    assert one == two and one.session_id == "dreaming:r1" and one.user_id is None
    assert one.metadata["wing"] == "dreaming" and one.messages[0].metadata["episode_ids"] == ["e1"]


def test_a_memory_is_dated_when_its_latest_episode_happened_not_when_it_was_dreamt() -> None:
    """A fact read from a dreamt memory later starts when it was said, not on the night of the run."""
    at = datetime(2026, 11, 20, tzinfo=UTC)
    (m,) = extractive([ep(1, []), ep(3, []), ep(2, [])])
    times = {"e1": datetime(2026, 10, 1, tzinfo=UTC), "e2": datetime(2026, 10, 2, tzinfo=UTC),
             "e3": datetime(2026, 10, 3, tzinfo=UTC)}
    event = session_event("w", "r1", "a", "", [m], "extractive", at=at, episode_times=times)
    assert event.messages[0].created_at == datetime(2026, 10, 3, tzinfo=UTC)
    assert event.completed_at == at  # the run itself happened at the claim
    # An episode whose time is unknown leaves the run's.
    assert session_event("w", "r1", "a", "", [m], "extractive", at=at).messages[0].created_at == at
