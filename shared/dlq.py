"""Dead-letter stream access: list what failed and why, and re-drive it onto its original subject."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.js.errors import NotFoundError

from shared.bus import dead_letter_info
from shared.config import Settings
from shared.events import DeadLetterInfo

__all__ = ["DeadLetter", "get_dead_letter", "list_dead_letters", "payload_preview", "redrive"]


@dataclass
class DeadLetter:
    seq: int
    info: DeadLetterInfo
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


async def _connect(nats_url: str) -> nats.NATS:
    return await nats.connect(nats_url.split(","), connect_timeout=5, max_reconnect_attempts=3)


async def list_dead_letters(settings: Settings, nats_url: str, *, subject: str | None = None,
                            workspace: str | None = None, limit: int = 1000) -> list[DeadLetter]:
    """Dead letters in stream order (optionally only those from ``subject`` or of ``workspace``)."""
    nc = await _connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            si = await js.stream_info(settings.dlq_stream_name)
        except NotFoundError:
            return []
        out: list[DeadLetter] = []
        if not si.state.messages:
            return out
        for seq in range(si.state.first_seq, si.state.last_seq + 1):
            try:
                m = await js.get_msg(settings.dlq_stream_name, seq)
            except NotFoundError:
                continue
            info = dead_letter_info(m.headers).model_copy(update={"stream_seq": seq})
            if (subject and info.subject != subject) or (workspace and info.workspace_id != workspace):
                continue
            out.append(DeadLetter(seq, info, m.data or b"", dict(m.headers or {})))
            if len(out) >= limit:
                break
        return out
    finally:
        await nc.close()


async def get_dead_letter(settings: Settings, nats_url: str, seq: int) -> DeadLetter | None:
    """One dead letter by its sequence in the dead-letter stream, headers and payload included."""
    nc = await _connect(nats_url)
    try:
        try:
            m = await nc.jetstream().get_msg(settings.dlq_stream_name, seq)
        except NotFoundError:
            return None
        info = dead_letter_info(m.headers).model_copy(update={"stream_seq": seq})
        return DeadLetter(seq, info, m.data or b"", {str(k): str(v) for k, v in (m.headers or {}).items()})
    finally:
        await nc.close()


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


async def redrive(settings: Settings, nats_url: str, seqs: list[int]) -> int:
    """Republish dead letters to their original subjects, then remove them. Returns how many."""
    nc = await _connect(nats_url)
    done = 0
    try:
        js = nc.jetstream()
        for seq in seqs:
            try:
                m = await js.get_msg(settings.dlq_stream_name, seq)
            except NotFoundError:
                continue
            info = dead_letter_info(m.headers)
            await js.publish(info.subject, m.data or b"", stream=settings.stream_name)
            await js.delete_msg(settings.dlq_stream_name, seq)
            done += 1
    finally:
        await nc.close()
    return done
