"""What the CLI prints: tables laid out for the width they are printed at, and dead-letter payloads.

A table of fixed-width columns beside one flexible column leaves the flexible one nothing at 80
columns, which is also the width Rich assumes when output is piped; that column holds what a user
came for (a memory's content, a dead letter's reason). So each table here is a renderable that picks
its layout at render time from the width it is given: below a threshold, search hits stack their
metadata above the content in one wide cell, and dead letters drop secondary columns and cut the
reason with an ellipsis, keeping one line per letter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from shared.events import DeadLetterInfo

__all__ = ["CONTENT_PREVIEW_CHARS", "DeadLetterTable", "EpisodesTable", "FactsTable", "HitsTable", "LayerTable",
           "payload_preview", "short_reason"]

CONTENT_PREVIEW_CHARS = 300  # one hit's content in a table; `--json` prints it whole
_WIDE_HITS = 120  # from here the one-column-per-field layout leaves content at least ~40 columns
_WIDE_DLQ = 160  # all nine columns and still a reason of ~50 characters


def _field(hit: Any, key: str) -> Any:
    return hit.get(key) if isinstance(hit, dict) else getattr(hit, key, None)


def _when(value: Any) -> str:
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d"))
    return str(value)[:10] if value else "-"


def _preview(content: str) -> str:
    return content[:CONTENT_PREVIEW_CHARS] + "…" if len(content) > CONTENT_PREVIEW_CHARS else content


class HitsTable:
    """Search hits: one column per field when wide, metadata stacked over the content when narrow."""

    def __init__(self, title: str, hits: Sequence[Any]) -> None:
        self.title = title
        self.hits = list(hits)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._wide() if options.max_width >= _WIDE_HITS else self._narrow()

    def _rows(self) -> Iterator[tuple[str, str, str, str, str, str, str]]:
        for i, h in enumerate(self.hits, 1):
            yield (str(i), f"{float(_field(h, 'score') or 0):.3f}", _field(h, "memory_type") or "-",
                   f"{_field(h, 'wing')}/{_field(h, 'room')}", _when(_field(h, "occurred_at")),
                   _field(h, "speaker") or "-", _preview(str(_field(h, "content") or "")))

    def _wide(self) -> Table:
        t = Table(title=self.title, expand=True)
        t.add_column("#", justify="right", width=3)
        t.add_column("score", justify="right", width=6)
        t.add_column("type", width=10)
        t.add_column("wing/room", width=22, overflow="fold")
        t.add_column("when", width=10)  # recall ranks by the time a question names: show it
        t.add_column("who", width=10, overflow="fold")
        t.add_column("content", ratio=1, overflow="fold")
        for row in self._rows():
            t.add_row(*(Text(c) for c in row))
        return t

    def _narrow(self) -> Table:
        t = Table(title=self.title, expand=True, show_lines=True)
        t.add_column("#", justify="right", no_wrap=True)
        t.add_column("score", justify="right", no_wrap=True)
        t.add_column("memory", ratio=1, overflow="fold")
        for i, score, kind, place, when, who, content in self._rows():
            cell = Text(" · ".join((kind, place, when, who)), style="dim", overflow="fold")
            cell.append("\n")
            cell.append(content, style="")
            t.add_row(i, score, cell)
        return t


class EpisodesTable:
    """Episodes recall returned: one stacked cell each (session, time span, topics, then the summary),
    readable at any width; the first drawer's citation says where the conversation's turns are."""

    def __init__(self, title: str, episodes: Sequence[Any]) -> None:
        self.title = title
        self.episodes = list(episodes)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        t = Table(title=self.title, expand=True, show_lines=True)
        t.add_column("#", justify="right", no_wrap=True)
        t.add_column("score", justify="right", no_wrap=True)
        t.add_column("episode", ratio=1, overflow="fold")
        for i, e in enumerate(self.episodes, 1):
            drawers = _field(e, "drawers") or []
            head = [str(_field(e, "session_id")),
                    f"{_when(_field(e, 'started_at'))} → {_when(_field(e, 'completed_at'))}",
                    ", ".join(_field(e, "topics") or []) or "-",
                    f"{_field(e, 'drawer_count') or 0} drawers" + (f", first {drawers[0]}" if drawers else "")]
            cell = Text(" · ".join(head), style="dim", overflow="fold")
            cell.append("\n")
            cell.append(_preview(str(_field(e, "summary") or _field(e, "abstract") or "")), style="")
            t.add_row(str(i), f"{float(_field(e, 'score') or 0):.3f}", cell)
        yield t


def short_reason(info: DeadLetterInfo) -> str:
    """The reason without the "invalid <subject> event: " prefix the subject column already says."""
    prefix = f"invalid {info.subject} event: "
    reason = info.reason.removeprefix(prefix) if info.reason.startswith(prefix) else info.reason
    return " ".join(reason.split())  # one line: a newline in a reason would break the row


class DeadLetterTable:
    """Dead letters, one line each; the reason fills the remaining width and ends in an ellipsis."""

    def __init__(self, items: Iterable[tuple[int, DeadLetterInfo]]) -> None:
        self.items = list(items)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= _WIDE_DLQ
        subjects = {f.subject for _, f in self.items}
        # One subject for all (the usual case, or --subject): say it once in the title, not on every row.
        shared_subject = subjects.pop() if len(subjects) == 1 else None
        title = f"dead letters ({len(self.items)})" + (f" from {shared_subject}" if shared_subject else "")
        t = Table(title=title, expand=True, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  caption="palace dlq show SEQ: full reason, headers and payload")
        cols: list[tuple[str, dict[str, Any]]] = [("seq", {"justify": "right"})]
        if not shared_subject:
            cols += [("subject", {"max_width": 18})]
        if wide:
            cols += [("service", {"max_width": 10}), ("tries", {"justify": "right"}), ("failed at", {}),
                     ("workspace", {"max_width": 20}), ("session", {"max_width": 20}), ("size", {"justify": "right"})]
        else:
            cols += [("workspace/session", {"max_width": 20})]
        for name, kw in cols:
            t.add_column(name, no_wrap=True, overflow="ellipsis", **kw)
        t.add_column("reason", ratio=1, no_wrap=True, overflow="ellipsis", min_width=20)
        for seq, f in self.items:
            cells = [str(seq)] + ([] if shared_subject else [f.subject])
            if wide:
                cells += [f.service, str(f.deliveries), f.failed_at.strftime("%Y-%m-%d %H:%M:%S"),
                          f.workspace_id or "-", f.session_id or "-", str(f.size)]
            else:
                cells += [f"{f.workspace_id or '-'}/{f.session_id or '-'}"]
            t.add_row(*(Text(c) for c in [*cells, short_reason(f)]))
        yield t


def _shorten(value: Any, max_str: int, max_items: int) -> Any:
    if isinstance(value, str) and len(value) > max_str:
        return f"{value[:max_str]}… (+{len(value) - max_str:,} characters)"
    if isinstance(value, list):
        head = [_shorten(v, max_str, max_items) for v in value[:max_items]]
        return [*head, f"… (+{len(value) - max_items:,} more items)"] if len(value) > max_items else head
    if isinstance(value, dict):
        return {k: _shorten(v, max_str, max_items) for k, v in value.items()}
    return value


def payload_preview(data: bytes, *, full: bool = False, max_str: int = 500, max_items: int = 20,
                    max_chars: int = 20_000) -> tuple[str, bool]:
    """A dead letter's payload as text a person can read, and whether it is JSON.

    JSON is pretty-printed; unless ``full``, long strings and long lists inside it are cut where they
    are (a 200,000-character message or 10,000 messages keep the event's shape readable), then the
    whole text is capped at ``max_chars``. Bytes that are not UTF-8 are shown escaped, never dropped.
    """
    text = data.decode("utf-8", errors="backslashreplace")
    try:
        parsed = json.loads(data)
    except ValueError:
        is_json = False
    else:
        is_json = True
        text = json.dumps(parsed if full else _shorten(parsed, max_str, max_items), indent=2, ensure_ascii=False)
    if not full and len(text) > max_chars:
        text = f"{text[:max_chars]}\n… (+{len(text) - max_chars:,} characters; --full shows everything)"
    return text, is_json


def _day(value: Any) -> str:
    return value.strftime("%Y-%m-%d") if hasattr(value, "strftime") else (str(value)[:10] if value else "")


class FactsTable:
    """Knowledge-graph facts: subject, relation, object and their validity. Wide, one column each;
    narrow (80 columns), the fact as one folded "subject —relation→ object" cell beside its dates."""

    def __init__(self, title: str, facts: Sequence[Any]) -> None:
        self.title = title
        self.facts = list(facts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= 100
        t = Table(title=self.title, title_justify="left", expand=True, box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=None if self.facts else "no facts")
        if wide:
            t.add_column("subject", ratio=1, overflow="fold")
            t.add_column("relation", max_width=24, overflow="fold")
            t.add_column("object", ratio=1, overflow="fold")
        else:
            t.add_column("fact", ratio=1, overflow="fold")
        t.add_column("from", no_wrap=True, width=10)
        t.add_column("to", no_wrap=True, width=10)
        for f in self.facts:
            to = _day(_field(f, "valid_to")) or ("now" if _field(f, "current") else "")
            style = "" if _field(f, "current") else "dim"
            s, p, o = str(_field(f, "subject")), str(_field(f, "predicate")), str(_field(f, "object"))
            cells = [Text(s), Text(p), Text(o)] if wide else [Text(f"{s} —{p}→ {o}")]
            t.add_row(*cells, Text(_day(_field(f, "valid_from")) or "-"), Text(to), style=style)
        yield t


class LayerTable:
    """Drawers of a memory layer (wake-up's L1, recall's L2) in the layer's order: where, what, importance."""

    def __init__(self, title: str, drawers: Sequence[Any]) -> None:
        self.title = title
        self.drawers = list(drawers)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        t = Table(title=self.title, title_justify="left", expand=True, box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=None if self.drawers else "no drawers")
        wide = options.max_width >= 100
        t.add_column("wing/room", max_width=24 if wide else 16, overflow="fold")
        t.add_column("memory", ratio=1, overflow="fold")
        t.add_column("imp.", justify="right", no_wrap=True, width=4)
        t.add_column("drawer", no_wrap=True, width=12)
        for d in self.drawers:
            where = f"{_field(d, 'wing')}/{'' if wide else chr(10)}{_field(d, 'room')}"  # narrow: room on its own line
            t.add_row(Text(where), Text(str(_field(d, "snippet"))),
                      Text(f"{float(_field(d, 'importance') or 0):.1f}"), Text(str(_field(d, "id"))[:12]))
        yield t
