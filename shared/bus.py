"""The bus: FastStream's NATS broker (connection, publishing), the JetStream streams and consumers,
and dead-lettering.

Consuming is ``shared.consumers`` (our own pull loop; its docstring says why). Delivery is
at-least-once and every handler is idempotent; derived events carry ``Nats-Msg-Id`` = a deterministic
event id, so JetStream drops the duplicates a retried publish would make.

Retention never discards an event a consumer has not processed: the pipeline stream keeps a message
until every consumer interested in its subject has acked it (interest retention), has no age limit,
and refuses new messages when full (discard new) instead of dropping old ones, so a producer learns
of it from a failed publish while ``palace_stream_bytes`` / ``palace_stream_max_bytes`` alert first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import nats.js.api as js_api
import structlog
from faststream.nats import NatsBroker
from nats.js.errors import NotFoundError
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from shared import metrics, tracing
from shared.config import Settings
from shared.consumers import CONSUMERS, Poison, consumer_config, pipeline_subjects
from shared.events import DeadLetterInfo, Event, payload_ids
from shared.faults import is_transient
from shared.logging import get_logger
from shared.nats_client import nats_options

__all__ = [
    "EventTooLarge",
    "Poison",
    "announce_rewritten",
    "build_broker",
    "dead_letter",
    "dead_letter_info",
    "decode_event",
    "ensure_streams",
    "publish_event",
    "publish_held",
    "session_limit_problem",
    "stream_configs",
    "stream_usage",
]

log = get_logger("palace.bus")


class EventTooLarge(ValueError):
    """An event whose JSON is over ``max_event_bytes``: its consumers would dead-letter it, so it is not
    published (the caller splits it, or answers 413)."""


def session_limit_problem(event: Event, settings: Settings) -> str | None:
    """What makes a ``session.completed`` one that ingest refuses beyond its schema (more messages than
    ``max_messages_per_session``), in words; None when it is within. Ingest dead-letters such an event; the
    API refuses it before publishing, with the same words."""
    messages = getattr(event, "messages", None)
    if messages is not None and len(messages) > settings.max_messages_per_session:
        return f"session has {len(messages)} messages; the limit is {settings.max_messages_per_session}"
    return None


def decode_event(model: type[Event], data: bytes, settings: Settings) -> Any:
    """Validate raw bytes into ``model`` or raise ``Poison`` with a precise, human-readable reason.

    Every handler decodes its event here, so this is where the message's ``workspace_id`` and
    ``event_id`` join the log context (the consumer loop clears them per message; a batch keeps none,
    its lines would otherwise name an arbitrary one of its events)."""
    if len(data) > settings.max_event_bytes:
        raise Poison(f"payload of {len(data)} bytes exceeds the {settings.max_event_bytes}-byte limit")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Poison(f"payload is not valid UTF-8 (byte {e.start})") from None
    try:
        event = model.model_validate_json(data)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        head = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in errs[:5]
        )
        more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
        raise Poison(f"invalid {model.subject} event: {head}{more}") from None
    if not tracing.in_batch():
        structlog.contextvars.bind_contextvars(workspace_id=event.workspace_id, event_id=event.event_id)
    return event


def build_broker(settings: Settings, service: str, nats_url: str) -> NatsBroker:
    """A broker for one service: connection (reconnecting forever) and publishing."""
    return NatsBroker(
        nats_url.split(","),
        name=f"palace-{service}",
        graceful_timeout=settings.shutdown_grace_s,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        allow_reconnect=True,
        **nats_options(settings),
    )


def stream_configs(settings: Settings) -> list[js_api.StreamConfig]:
    """The pipeline stream and the dead-letter stream, as they should be."""
    return [
        js_api.StreamConfig(
            name=settings.stream_name, subjects=pipeline_subjects(), storage=js_api.StorageType.FILE,
            retention=js_api.RetentionPolicy.INTEREST, max_age=0, max_bytes=settings.stream_max_bytes,
            discard=js_api.DiscardPolicy.NEW, duplicate_window=settings.duplicate_window_s, max_msg_size=-1,
            num_replicas=settings.stream_replicas,
        ),
        # Dead letters wait for a person (``palace dlq``): kept until re-driven or deleted, unless an
        # operator sets an age limit; when full, dead-lettering fails and the message stays in the
        # pipeline stream (held, not lost).
        js_api.StreamConfig(
            name=settings.dlq_stream_name, subjects=["dlq.>"], storage=js_api.StorageType.FILE,
            retention=js_api.RetentionPolicy.LIMITS, max_age=settings.dlq_max_age_days * 86_400.0,
            max_bytes=settings.stream_max_bytes, discard=js_api.DiscardPolicy.NEW,
            duplicate_window=settings.duplicate_window_s, num_replicas=settings.stream_replicas,
        ),
    ]


async def ensure_streams(broker: NatsBroker, settings: Settings) -> None:
    """Create or update both streams and every durable consumer (idempotent, safe from every replica).

    All consumers are declared here, not only the caller's: under interest retention a message that
    arrives while no consumer exists for its subject would be dropped, so the first process to reach
    the bus makes the whole pipeline's interest exist before anything is published.
    """
    js = broker.config.connection_state.stream
    for cfg in stream_configs(settings):
        try:
            have = await js.stream_info(cfg.name)  # type: ignore[arg-type]
        except NotFoundError:
            with contextlib.suppress(Exception):  # another replica may have won the race
                await js.add_stream(cfg)
            await js.stream_info(cfg.name)  # type: ignore[arg-type]
            continue
        if have.config.retention != cfg.retention:
            # JetStream cannot change a stream's retention in place; say what to do instead of failing.
            log.warning("stream_retention_differs", stream=cfg.name, have=str(have.config.retention),
                        want=str(cfg.retention), hint="drain the pipeline, then delete and recreate the stream")
            cfg = dataclasses.replace(cfg, retention=have.config.retention)
        await js.update_stream(cfg)
    for c in CONSUMERS:
        await js.add_consumer(settings.stream_name, consumer_config(settings, c))


async def stream_usage(broker: NatsBroker, settings: Settings) -> None:
    """Export each stream's size and limit, so an alert fires well before discard-new refuses events."""
    js = broker.config.connection_state.stream
    for name in (settings.stream_name, settings.dlq_stream_name):
        with contextlib.suppress(Exception):
            si = await js.stream_info(name)
            metrics.STREAM_MESSAGES.labels(name).set(si.state.messages or 0)
            metrics.STREAM_BYTES.labels(name).set(si.state.bytes or 0)
            metrics.STREAM_MAX_BYTES.labels(name).set(si.config.max_bytes or -1)


async def publish_event(
    broker: NatsBroker, settings: Settings, event: Event, *, caused_by: Event | None = None
) -> bool:
    """Publish to JetStream and wait for the store ack; the event id de-duplicates retries. Returns
    whether JetStream already held the event (a repeat within PALACE_DUPLICATE_WINDOW_S: not stored again).

    The current trace context goes along in the headers (``traceparent``). A batch handler names the
    event each publish derives from (``caused_by``), so it continues that event's trace."""
    data = event.model_dump_json().encode()
    if len(data) > settings.max_event_bytes:
        # decode_event would dead-letter it at every consumer: refused here, where the caller can still split it.
        raise EventTooLarge(f"the {event.subject} event is {len(data):,} bytes of JSON; the limit is "
                            f"{settings.max_event_bytes:,} (PALACE_MAX_EVENT_BYTES): split it")
    headers = event.dedup_headers()
    with tracing.publishing(event.subject, headers, event_id=event.event_id,
                            cause=caused_by.event_id if caused_by is not None else None):
        ack = await broker.publish(
            data,
            subject=event.subject,
            headers=headers,
            stream=settings.stream_name,
            timeout=10.0,
        )
    return bool(getattr(ack, "duplicate", False))


async def publish_held(
    broker: NatsBroker, settings: Settings, event: Event, *, caused_by: Event | None = None
) -> None:
    """``publish_event`` after work too costly to repeat (a model's answer, committed): while NATS cannot
    take the event (reconnecting, a publish timing out) it is published again here, with backoff, for up to
    ``dependency_wait_s``. Raised to the handler instead, the consumer loop would hold and run the whole
    handler again, asking the model again each time; the event id makes a repeat harmless."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(is_transient), stop=stop_after_delay(settings.dependency_wait_s),
        wait=wait_exponential_jitter(multiplier=0.25, max=settings.dependency_retry_max_s), reraise=True,
    ):
        with attempt:
            await publish_event(broker, settings, event, caused_by=caused_by)


async def announce_rewritten(broker: NatsBroker, settings: Settings, workspace_id: str, drawer_ids: list[str],
                             cause: str, *, caused_by: Event | None = None) -> None:
    """Drawers whose words a curation UPDATE rewrote (left raw, without a vector: ``apply_proposal``),
    announced to embed after the commit, so their new words are embedded and classified at once. Should the
    announcement be lost (a crash just after the commit), maintain's re-drive finds them raw."""
    from shared.events import DrawerCreated
    from shared.ids import event_id_for

    ids = sorted(set(drawer_ids))
    if ids:
        await publish_held(broker, settings, DrawerCreated(
            event_id=event_id_for("drawer.rewritten", workspace_id, cause, *ids), workspace_id=workspace_id,
            drawer_ids=ids), caused_by=caused_by)


def _header_value(value: object) -> str:
    """Header values as printable ASCII: reasons and ids quote the payload (an unknown field's name, a
    workspace id), and a non-ASCII or control character there made ``js.get_msg``, whose header parser
    is the e-mail one, return ``Header`` objects instead of strings, so listing the DLQ failed."""
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if c.isascii() and c.isprintable() else c.encode("unicode_escape").decode() for c in text)


async def dead_letter(
    broker: NatsBroker, settings: Settings, *, service: str, raw: Any, reason: str, error_type: str
) -> None:
    """Copy a message verbatim to ``dlq.<subject>`` with what went wrong in its headers."""
    meta = raw.metadata
    workspace_id = event_id = session_id = None
    with contextlib.suppress(Exception):  # a payload that is not JSON still gets its dead letter
        body = json.loads(raw.data)
        if isinstance(body, dict):
            workspace_id = str(body.get("workspace_id"))[:128] if body.get("workspace_id") else None
            event_id, session_id = payload_ids(body)
    info = DeadLetterInfo(
        subject=raw.subject, service=service, reason=reason[:2000], error_type=error_type,
        deliveries=meta.num_delivered, failed_at=datetime.now(UTC), event_id=event_id and event_id[:256],
        workspace_id=workspace_id, session_id=session_id and session_id[:256], size=len(raw.data),
    )
    headers = {f"Palace-{k}": _header_value(v) for k, v in info.model_dump(mode="json", exclude_none=True).items()}
    # One dead letter per (stream, sequence): a redelivered failure doesn't duplicate it.
    headers["Nats-Msg-Id"] = f"dlq:{meta.stream}:{meta.sequence.stream}"
    # The dead letter stays in the failed message's trace (its span records why), and a re-drive keeps it.
    with tracing.publishing(f"dlq.{raw.subject}", headers, event_id=event_id, cause=event_id):
        await broker.publish(
            raw.data, subject=f"dlq.{raw.subject}", headers=headers, stream=settings.dlq_stream_name, timeout=10.0
        )
    metrics.DEAD_LETTERED.labels(service, raw.subject).inc()
    if error_type == "invalid":
        # Counted here, not by the caller: a batch handler dead-letters its bad events one by one.
        metrics.FAILED.labels(service, raw.subject, "invalid").inc()
    log.warning("dead_lettered", service=service, subject=raw.subject, reason=reason[:500],
                deliveries=meta.num_delivered, workspace_id=workspace_id, session_id=info.session_id,
                event_id=info.event_id)


def dead_letter_info(headers: dict[str, str] | None) -> DeadLetterInfo:
    """Rebuild the record from a dead letter's headers (for listing and re-driving)."""
    h = headers or {}
    fields = {k.removeprefix("Palace-"): str(v) for k, v in h.items() if k.startswith("Palace-")}
    return DeadLetterInfo.model_validate(fields)
