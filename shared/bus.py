"""The bus: FastStream's NATS broker, JetStream streams and consumers, dead-lettering, publishing.

This is the only ``shared`` module that imports FastStream. Delivery is at-least-once; the
pipeline middleware turns handler outcomes into acks:

* success → ack (after the handler's commit);
* ``Poison`` (invalid input) → copy to ``dlq.<subject>`` with the reason, then ack: retrying cannot help;
* a dependency down (``shared.faults.is_transient``: database, bus, embedding endpoint) → the
  message is held and retried in place, with backoff, for up to ``dependency_wait_s``: an outage
  must not use up a good message's attempts and dead-letter it;
* any other exception → NAK with a delay from ``backoff_s``; on attempt ``max_deliver`` → dead-letter.

The server-side ``max_deliver`` is two higher than ours, so a message whose handler crashed the
process (no NAK sent) is still redelivered, seen past the limit, and dead-lettered instead of
silently dropped by the server.

While a handler runs, its messages get an in-progress ack (``+WPI``) every third of ``ack_wait``:
a slow dependency (an embedder taking longer than ``ack_wait`` for a batch) must not make
JetStream redeliver work that is still being done, which would double it and spend the message's
deliveries until a healthy-but-slow pipeline dead-letters it. A handler that hangs stops being
kept alive after ten ``ack_wait`` periods, so it is redelivered as if its process had died.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import nats.js.api as js_api
from faststream import BaseMiddleware
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from shared import metrics
from shared.config import Settings
from shared.events import DeadLetterInfo, Event, payload_ids
from shared.faults import is_transient
from shared.logging import get_logger

__all__ = [
    "PIPELINE_SUBJECTS",
    "Poison",
    "build_broker",
    "consumer_config",
    "decode_event",
    "ensure_consumer",
    "ensure_streams",
    "publish_event",
    "subscriber_kwargs",
]

log = get_logger("palace.bus")

PIPELINE_SUBJECTS = [
    "session.completed",
    "session.stored",
    "drawer.created",
    "drawer.embedded",
    "drawer.classified",
    "episodic.created",
    "entity.upserted",
]
_H_REASON = "Palace-Reason"


class Poison(Exception):
    """The message can never be processed (malformed, wrong schema, too large): dead-letter it now."""


def decode_event(model: type[Event], data: bytes, settings: Settings) -> Any:
    """Validate raw bytes into ``model`` or raise ``Poison`` with a precise, human-readable reason."""
    if len(data) > settings.max_event_bytes:
        raise Poison(f"payload of {len(data)} bytes exceeds the {settings.max_event_bytes}-byte limit")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Poison(f"payload is not valid UTF-8 (byte {e.start})") from None
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        head = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in errs[:5]
        )
        more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
        raise Poison(f"invalid {model.subject} event: {head}{more}") from None


def _nats_options(settings: Settings) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if settings.nats_user:
        opts["user"] = settings.nats_user
        opts["password"] = settings.nats_password
    if settings.nats_token:
        opts["token"] = settings.nats_token
    if settings.nats_creds:
        opts["user_credentials"] = settings.nats_creds
    if settings.nats_tls_ca:
        opts["tls"] = ssl.create_default_context(cafile=settings.nats_tls_ca)
    return opts


def build_broker(settings: Settings, service: str, nats_url: str) -> NatsBroker:
    """A broker for one service: pipeline middleware, NACK on error, graceful drain on stop."""
    return NatsBroker(
        nats_url.split(","),
        name=f"palace-{service}",
        middlewares=[_pipeline_middleware(settings, service)],
        ack_policy=AckPolicy.NACK_ON_ERROR,
        graceful_timeout=settings.shutdown_grace_s,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        allow_reconnect=True,
        **_nats_options(settings),
    )


def consumer_config(settings: Settings, durable: str, subject: str) -> js_api.ConsumerConfig:
    """Durable pull consumer shared by a service's replicas."""
    return js_api.ConsumerConfig(
        durable_name=durable,
        filter_subject=subject,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        max_deliver=settings.max_deliver + 2,
        max_ack_pending=settings.max_ack_pending,
    )


async def _raw_decoder(msg: Any) -> Any:
    """Hand handlers the raw payload (bytes, or a list of bytes for batches): validation, and its
    dead-letter reason, belong to ``decode_event``, not to a generic JSON decoder."""
    return msg.body


def subscriber_kwargs(
    settings: Settings, durable: str, subject: str, *, batch: bool = False, batch_size: int | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``broker.subscriber`` binding to the pre-created durable consumer."""
    return {
        "subject": subject,
        "stream": JStream(settings.stream_name, declare=False),
        "durable": durable,
        "config": consumer_config(settings, durable, subject),
        "decoder": _raw_decoder,
        "pull_sub": PullSub(batch_size=batch_size or settings.fetch_batch, timeout=0.5 if batch else 5.0,
                            batch=batch),
    }


async def ensure_streams(broker: NatsBroker, settings: Settings) -> None:
    """Create or update the pipeline and dead-letter streams (idempotent, safe from every replica)."""
    js = broker.config.connection_state.stream
    day = 86_400.0
    wanted = [
        js_api.StreamConfig(
            name=settings.stream_name, subjects=PIPELINE_SUBJECTS, storage=js_api.StorageType.FILE,
            retention=js_api.RetentionPolicy.LIMITS, max_age=settings.stream_max_age_days * day,
            duplicate_window=120.0, discard=js_api.DiscardPolicy.OLD, max_msg_size=-1,
        ),
        js_api.StreamConfig(
            name=settings.dlq_stream_name, subjects=["dlq.>"], storage=js_api.StorageType.FILE,
            retention=js_api.RetentionPolicy.LIMITS, max_age=30 * day, duplicate_window=120.0,
        ),
    ]
    for cfg in wanted:
        try:
            await js.stream_info(cfg.name)  # type: ignore[arg-type]
            await js.update_stream(cfg)
        except NotFoundError:
            with contextlib.suppress(Exception):
                await js.add_stream(cfg)
            await js.stream_info(cfg.name)  # type: ignore[arg-type]


async def ensure_consumer(broker: NatsBroker, settings: Settings, durable: str, subject: str) -> None:
    """Create or update a durable consumer so configuration changes apply on redeploy."""
    js = broker.config.connection_state.stream
    await js.add_consumer(settings.stream_name, consumer_config(settings, durable, subject))


async def publish_event(broker: NatsBroker, settings: Settings, event: Event) -> None:
    """Publish to JetStream and wait for the store ack; the event id de-duplicates retries."""
    await broker.publish(
        event.model_dump_json().encode(),
        subject=event.subject,
        headers={"Nats-Msg-Id": f"{event.subject}:{event.event_id}"},
        stream=settings.stream_name,
        timeout=10.0,
    )


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
        import json

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


async def _keep_in_progress(raws: Sequence[Any], every_s: float, for_at_most_s: float) -> None:
    """Tell JetStream these messages are still being worked on (``+WPI``), so ``ack_wait`` only
    expires for a consumer that died, not for one waiting on a slow dependency."""
    deadline = time.monotonic() + for_at_most_s
    while time.monotonic() < deadline:
        await asyncio.sleep(every_s)
        for r in raws:
            if not r._ackd:
                with contextlib.suppress(Exception):  # a lost heartbeat only risks a redelivery
                    await r.in_progress()


def _pipeline_middleware(settings: Settings, service: str) -> Callable[..., BaseMiddleware]:
    backoff: Sequence[float] = settings.backoff_s or [1.0]
    heartbeat_s = max(0.2, settings.ack_wait_s / 3)

    class PipelineMiddleware(BaseMiddleware):
        """Metrics, dead-lettering and backoff for every consumed message (single or batch)."""

        async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
            raws = msg.raw_message if isinstance(msg.raw_message, list) else [msg.raw_message]
            subject = raws[0].subject if raws else "?"
            broker = self.context.get("broker")
            # Attempts past our limit mean earlier attempts died without a NAK (crash, OOM): stop here.
            over = [r for r in raws if r.metadata.num_delivered > settings.max_deliver]
            for r in over:
                await dead_letter(broker, settings, service=service, raw=r, error_type="crash",
                                  reason=f"exceeded {settings.max_deliver} deliveries without an outcome "
                                         "(the handler likely crashed the process)")
                await r.ack()
            if over and len(over) == len(raws):
                return None
            metrics.IN_FLIGHT.labels(service).inc(len(raws))
            start = time.perf_counter()
            heartbeat = asyncio.create_task(_keep_in_progress(raws, heartbeat_s, 10 * settings.ack_wait_s))
            hold_until = time.monotonic() + settings.dependency_wait_s
            waits = 0
            try:
                while True:
                    try:
                        result = await call_next(msg)
                        break
                    except Poison:
                        raise
                    except Exception as e:
                        if not is_transient(e) or time.monotonic() >= hold_until:
                            raise
                        # A dependency is down: every message would fail alike, so this one keeps its
                        # place (and its delivery count) and is retried here until the outage ends.
                        waits += 1
                        metrics.DEPENDENCY_WAITS.labels(service, type(e).__name__).inc()
                        log.warning("dependency_unavailable", service=service, subject=subject,
                                    error=repr(e)[:300], wait=waits)
                        for r in raws:
                            if not r._ackd:
                                with contextlib.suppress(Exception):
                                    await r.in_progress()  # keep JetStream from redelivering meanwhile
                        delay = min(settings.dependency_retry_max_s, 0.25 * 2 ** min(waits, 8))
                        await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            except Poison as e:
                for r in raws:
                    if not r._ackd:
                        await dead_letter(broker, settings, service=service, raw=r, reason=str(e),
                                          error_type="invalid")
                        await r.ack()
                return None
            except Exception as e:
                metrics.FAILED.labels(service, subject, type(e).__name__).inc(len(raws))
                log.warning("handler_failed", service=service, subject=subject, error=repr(e)[:500],
                            deliveries=[r.metadata.num_delivered for r in raws])
                for r in raws:
                    if r._ackd:
                        continue
                    n = r.metadata.num_delivered
                    if n >= settings.max_deliver:
                        await dead_letter(broker, settings, service=service, raw=r,
                                          reason=f"{type(e).__name__}: {e}", error_type=type(e).__name__)
                        await r.ack()
                    else:
                        await r.nak(delay=backoff[min(n - 1, len(backoff) - 1)])
                return None
            finally:
                heartbeat.cancel()
                metrics.IN_FLIGHT.labels(service).dec(len(raws))
                metrics.HANDLER_SECONDS.labels(service, subject).observe(time.perf_counter() - start)
            metrics.PROCESSED.labels(service, subject).inc(len(raws))
            return result

    return PipelineMiddleware

