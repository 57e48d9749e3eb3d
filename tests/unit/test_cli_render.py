"""The CLI's tables keep what a user came for visible at any width: the content of every hit, one
line per dead letter with the start of its reason, at 80 columns, piped, narrow and wide."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from io import StringIO

import pytest
from rich.console import Console

from services.cli_render import (
    CONTENT_PREVIEW_CHARS,
    DeadLetterTable,
    EpisodesTable,
    HitsTable,
    payload_preview,
    short_reason,
)
from shared.events import DeadLetterInfo

HITS = [
    {"score": 0.968, "memory_type": "decision", "wing": "project-orion", "room": "decision",
     "occurred_at": "2026-11-02T09:01:00Z", "speaker": "Maria",
     "content": "We decided to build Orion's backend on PostgreSQL with pgvector instead of running a separate "
                "vector database, because one system is easier to operate and back up."},
    {"score": 0.71, "memory_type": "preference", "wing": "a-very-long-wing-name-for-a-team", "room": "preferences",
     "occurred_at": None, "speaker": None, "content": "Use Postgres."},
    {"score": 0.5, "memory_type": None, "wing": "general", "room": "fact", "occurred_at": None, "speaker": "Bo",
     "content": " ".join(f"word{i}" for i in range(120))},
]


def _render(renderable: object, width: int | None) -> str:
    buf = StringIO()
    console = Console(file=buf, width=width) if width else Console(file=buf)  # no width: what a pipe gets
    console.print(renderable)
    return buf.getvalue()


def _content_column(out: str) -> str:
    """The last column of a boxed table, its lines joined: what a reader sees of the content."""
    cells = [line.split("│")[-2] for line in out.splitlines() if line.startswith("│")]
    return " ".join(" ".join(cells).split())


WIDTHS = [80, None, 60, 100, 200]


@pytest.mark.parametrize("width", WIDTHS)
def test_hits_show_every_content_at_any_width(width: int | None) -> None:
    out = _render(HitsTable("Which database did we choose for Orion?", HITS), width)
    assert all(len(line) <= (width or 80) for line in out.splitlines())
    shown = _content_column(out)
    for h in HITS:
        content = h["content"]
        expected = content[:CONTENT_PREVIEW_CHARS] + ("…" if len(content) > CONTENT_PREVIEW_CHARS else "")
        assert " ".join(expected.split()) in shown
    assert len(re.findall(r"^│\s*\d+\s*│", out, re.MULTILINE)) == len(HITS), "one numbered row per hit"


@pytest.mark.parametrize("width", [80, None])
def test_narrow_hits_keep_every_field(width: int | None) -> None:
    out = _render(HitsTable("q", HITS), width)
    for needle in ("decision", "project-orion/decision", "2026-11-02", "Maria", "0.968"):
        assert needle in out


def test_markup_in_content_is_printed_verbatim() -> None:
    out = _render(HitsTable("q", [{**HITS[1], "content": "Set [bold]x[/bold] to [red]"}]), 80)
    assert "Set [bold]x[/bold] to [red]" in _content_column(out)


def _letters(n: int, subjects: tuple[str, ...] = ("session.completed",)) -> list[tuple[int, DeadLetterInfo]]:
    return [(i * 37 + 1, DeadLetterInfo(
        subject=subjects[i % len(subjects)], service="ingest", error_type="invalid", deliveries=1,
        failed_at=datetime(2026, 11, 2, 9, 0, tzinfo=UTC), workspace_id=f"ws-{i}", session_id=f"chat-{i}",
        size=100 + i,
        reason=f"invalid {subjects[i % len(subjects)]} event: messages.{i}.content: Input should be a valid "
               "string\n" + "; then a long explanation " * 20)) for i in range(n)]


@pytest.mark.parametrize("width", [80, None, 100, 200])
@pytest.mark.parametrize("subjects", [("session.completed",), ("session.completed", "drawer.created")])
def test_dead_letters_stay_one_line_each(width: int | None, subjects: tuple[str, ...]) -> None:
    items = _letters(6, subjects)
    out = _render(DeadLetterTable(items), width)
    rows = [line for line in out.splitlines() if re.match(r"^\s*\d+\s{2,}\S", line)]
    assert len(rows) == len(items)
    assert len(out.splitlines()) <= len(items) + 6, "title, header, rule, caption: no wrapped reasons"
    for (seq, info), row in zip(items, rows, strict=True):
        assert row.lstrip().startswith(str(seq))
        assert short_reason(info)[:18] in row, "the reason's start is on its row"
        assert row.rstrip().endswith("…"), "a long reason is cut with an ellipsis"
        assert f"ws-{seq // 37}" in row


def test_short_reason_drops_only_the_redundant_prefix() -> None:
    info = _letters(1)[0][1]
    assert short_reason(info).startswith("messages.0.content: Input should be a valid string ;")
    other = info.model_copy(update={"reason": "TimeoutError: embedder"})
    assert short_reason(other) == "TimeoutError: embedder"


def test_payload_preview_shortens_inside_json_and_shows_bytes() -> None:
    import json

    big = {"workspace_id": "w", "messages": [{"role": "user", "content": "y" * 200_000}] * 50}
    text, is_json = payload_preview(json.dumps(big).encode())
    assert is_json and len(text) < 20_000
    assert "+199,500 characters" in text and "+30 more items" in text and '"workspace_id": "w"' in text
    full, _ = payload_preview(json.dumps(big).encode(), full=True)
    assert json.loads(full) == big
    raw, is_json = payload_preview(b"not json \xff\xfe")
    assert not is_json and raw == "not json \\xff\\xfe"


@pytest.mark.parametrize("width", [80, None])
def test_palace_up_services_table_shows_whole_urls(width: int | None) -> None:
    from services.cli import _services_table

    names = ["ingest", "embed", "classify", "cluster", "enrich", "maintain", "api"]
    eps = {n: {"pid": 4_000_000 + i, "ready": f"http://127.0.0.1:{9101 + i}/readyz",
               "metrics": f"http://127.0.0.1:{9101 + i}/metrics"} for i, n in enumerate(names)}
    out = _render(_services_table(eps, {n: "not ready (503)" for n in names}), width)
    for ep in eps.values():
        assert str(ep["ready"]) in out and str(ep["metrics"]) in out


FACTS = [
    {"subject": "Orion", "predicate": "uses", "object": "MongoDB", "valid_from": "2024-06-01T00:00:00Z",
     "valid_to": "2025-01-14T00:00:00Z", "current": False},
    {"subject": "The Orion platform team at the Frankfurt office", "predicate": "is_responsible_for_operating",
     "object": "the PostgreSQL cluster with pgvector and its nightly backups", "valid_from": "2025-01-15T00:00:00Z",
     "valid_to": None, "current": True},
]


@pytest.mark.parametrize("width", [None, 80, 60, 160])
def test_facts_keep_both_ends_and_their_dates_at_any_width(width: int | None) -> None:
    from services.cli_render import FactsTable

    out = _render(FactsTable("timeline", FACTS), width)
    assert max(len(line) for line in out.splitlines()) <= (width or 80)
    flat = " ".join(out.split())
    for word in ("MongoDB", "2024-06-01", "2025-01-14", "2025-01-15", "now", "nightly", "backups", "Frankfurt"):
        assert word in flat, (word, out)


@pytest.mark.parametrize("width", [None, 80, 160])
def test_layer_drawers_show_the_snippet_and_short_id(width: int | None) -> None:
    from services.cli_render import LayerTable

    drawers = [{"id": "0123456789abcdef" * 2, "wing": "project-orion", "room": "decisions", "importance": 4.0,
                "snippet": HITS[0]["content"]}]
    out = _render(LayerTable("L1", drawers), width)
    assert max(len(line) for line in out.splitlines()) <= (width or 80)
    assert "0123456789ab" in out and "back up." in " ".join(out.split())


EPISODES = [
    {"session_id": "chat-44", "score": 0.873, "started_at": "2026-11-01T10:00:00Z",
     "completed_at": "2026-11-01T10:30:00Z", "topics": ["orion", "database"], "drawer_count": 12,
     "drawers": ["orion/decision/0123456789ab"],
     "summary": "The team chose PostgreSQL with pgvector for Orion. " * 3, "abstract": "Orion's database."},
    {"session_id": "chat-45", "score": 0.2, "started_at": None, "completed_at": None, "topics": [],
     "drawer_count": 0, "drawers": [], "summary": "", "abstract": "A short chat about [red] lunch."},
]


@pytest.mark.parametrize("width", [80, None, 200])
def test_episodes_show_session_span_topics_citation_and_summary(width: int | None) -> None:
    out = _render(EpisodesTable("episodes", EPISODES), width)
    assert all(len(line) <= (width or 80) for line in out.splitlines())
    shown = _content_column(out)
    for needle in ("chat-44", "2026-11-01", "orion, database", "12 drawers", "orion/decision/0123456789ab",
                   "The team chose PostgreSQL", "0.873", "A short chat about [red] lunch."):
        assert needle in shown or needle in out, needle
    assert len(re.findall(r"^│\s*\d+\s*│", out, re.MULTILINE)) == len(EPISODES)
