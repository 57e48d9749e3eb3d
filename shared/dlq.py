"""Dead-letter stream access: list what failed and why, and re-drive it onto its original subject."""

from __future__ import annotations

from dataclasses import dataclass, field

import nats
from nats.js.errors import NotFoundError

from shared.bus import dead_letter_info
from shared.config import Settings
from shared.events import DeadLetterInfo
from shared.nats_client import connect
from shared.tracing import trace_headers

__all__ = ["DeadLetter", "get_dead_letter", "list_dead_letters", "redrive"]


@dataclass
class DeadLetter:
    seq: int
    info: DeadLetterInfo
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


async def _connect(settings: Settings, nats_url: str) -> nats.NATS:
    return await connect(settings, nats_url, connect_timeout=5, max_reconnect_attempts=3)


async def list_dead_letters(settings: Settings, nats_url: str, *, subject: str | None = None,
                            workspace: str | None = None, limit: int = 1000) -> list[DeadLetter]:
    """Dead letters in stream order (optionally only those from ``subject`` or of ``workspace``)."""
    nc = await _connect(settings, nats_url)
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
    nc = await _connect(settings, nats_url)
    try:
        try:
            m = await nc.jetstream().get_msg(settings.dlq_stream_name, seq)
        except NotFoundError:
            return None
        info = dead_letter_info(m.headers).model_copy(update={"stream_seq": seq})
        return DeadLetter(seq, info, m.data or b"", {str(k): str(v) for k, v in (m.headers or {}).items()})
    finally:
        await nc.close()


async def redrive(settings: Settings, nats_url: str, seqs: list[int]) -> int:
    """Republish dead letters to their original subjects, then remove them. Returns how many."""
    nc = await _connect(settings, nats_url)
    done = 0
    try:
        js = nc.jetstream()
        for seq in seqs:
            try:
                m = await js.get_msg(settings.dlq_stream_name, seq)
            except NotFoundError:
                continue
            info = dead_letter_info(m.headers)
            # The re-driven event continues the trace it failed in.
            await js.publish(info.subject, m.data or b"", stream=settings.stream_name,
                             headers=trace_headers(m.headers) or None)
            await js.delete_msg(settings.dlq_stream_name, seq)
            done += 1
    finally:
        await nc.close()
    return done
