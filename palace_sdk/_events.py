"""Publishing ``session.completed`` to NATS JetStream, validated before anything is sent."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from pydantic import ValidationError

from palace_sdk.errors import EventInvalid, NatsUnreachable
from palace_sdk.models import Published
from shared.events.models import MAX_EVENT_BYTES, SessionCompleted

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_STREAM", "connect", "encode_session", "publish_encoded"]

DEFAULT_STREAM = "PALACE"
DEFAULT_MAX_EVENT_BYTES = MAX_EVENT_BYTES  # the pipeline's PALACE_MAX_EVENT_BYTES default


def encode_session(event: SessionCompleted | dict[str, Any], max_bytes: int) -> tuple[SessionCompleted, bytes]:
    """The event checked against the ``session.completed`` model (the source of schemas/'s JSON Schema)
    and its size limit, and its JSON. ``EventInvalid`` names what is wrong; nothing is sent then."""
    try:
        model = event if isinstance(event, SessionCompleted) else SessionCompleted.model_validate(event)
    except ValidationError as e:
        raise EventInvalid(f"not a valid session.completed event: {e}") from e
    data = model.model_dump_json(exclude_none=True).encode()
    if len(data) > max_bytes:
        raise EventInvalid(f"the event is {len(data):,} bytes of JSON; the pipeline accepts at most {max_bytes:,} "
                           "(split the session)")
    return model, data


async def publish_encoded(nc: nats.NATS, model: SessionCompleted, data: bytes, stream: str | None,
                          ack_wait_s: float) -> Published:
    """Publish and wait for JetStream's store acknowledgement. The message id is the event id, so a
    retry of the same event (or the same session re-sent) is stored once. The one publisher of
    ``session.completed`` over a plain NATS connection: the SDK, the CLI, the development package and
    the fault suite all send through it."""
    ack = await nc.jetstream().publish(
        SessionCompleted.subject, data, timeout=ack_wait_s, stream=stream, headers=model.dedup_headers())
    return Published(event_id=model.event_id or "", stream=ack.stream, seq=ack.seq,
                     duplicate=bool(ack.duplicate))


async def connect(nats_url: str, timeout: float) -> nats.NATS:  # noqa: ASYNC109 - also the per-try timeout
    """A connection to the stack's NATS, or ``NatsUnreachable`` within about ``timeout``: nats-py's own
    defaults try each server 60 times two seconds apart, logging a traceback each time, before giving up
    with an error of its own."""
    async def quiet(_: Exception) -> None:  # the outcome is raised (or the connection returned) here
        return None

    try:
        return await asyncio.wait_for(
            nats.connect(nats_url.split(","), connect_timeout=timeout, max_reconnect_attempts=3,
                         reconnect_time_wait=min(1.0, timeout / 4), error_cb=quiet),
            timeout * 2)
    except (OSError, TimeoutError, nats.errors.Error) as e:
        raise NatsUnreachable(f"no NATS server at {nats_url} answered ({type(e).__name__}: {e})") from e
