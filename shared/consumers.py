"""Durable pull consumers: the one table of who consumes what, and the loop that feeds handlers.

Why our own pull loop instead of FastStream's subscribers: faststream 0.7.8 (the newest release)
catches ``nats.errors.TimeoutError`` around ``PullSubscription.fetch``, but nats-py 2.16's batch
fetch (``_fetch_n``) raises the *builtin* ``asyncio.TimeoutError`` on several of its paths. That
exception escaped FastStream's loop: the supervisor restarted the task ("raised an exception,
retrying…") and, in its batch subscriber, dropped the messages it had already fetched in that round.
JetStream had counted them delivered, so nobody saw them until ``ack_wait`` expired and they were
redelivered: the 60 s stalls, behind a consumer lag of zero. Catching the builtin ``TimeoutError``
(of which nats-py's is a subclass) fixes that, but the loop also has to give us what FastStream's
does not: a bounded window of concurrent handlers, fetching only as many messages as there are free
slots (so nothing waits un-acked in a client buffer), one heartbeat task per consumer instead of one
per message, and a drain on shutdown that hands back fetched-but-unstarted messages at once. The
loop is small; FastStream still owns the connection and publishing (``shared.bus``).

Outcomes, for every message (single or batch):

* success → ack (the handler committed first);
* ``Poison`` → copy to ``dlq.<subject>`` with the reason, then ack: retrying cannot help;
* a dependency down (``shared.faults.is_transient``) → held and retried in place with backoff, for up
  to ``dependency_wait_s``, with in-progress acks so JetStream does not redeliver meanwhile;
* any other exception → NAK with a delay from ``backoff_s``; on attempt ``max_deliver`` → dead-letter;
* delivered more than ``max_deliver`` times (earlier attempts died without a NAK) → dead-lettered
  before the handler sees it: a message past its limit is never processed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats.js.api as js_api
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from shared import metrics, tracing
from shared.config import Settings
from shared.faults import dependency_of, is_transient
from shared.logging import get_logger

__all__ = [
    "CONSUMERS",
    "BatchHandler",
    "Consumer",
    "Handler",
    "HandlerTimeout",
    "Poison",
    "PullConsumer",
    "consumer",
    "consumer_config",
    "consumer_for",
    "consumers_of",
    "oldest_unacked_age_s",
    "pipeline_subjects",
]

log = get_logger("palace.consumers")

Handler = Callable[[bytes, Msg], Awaitable[None]]
BatchHandler = Callable[[list[bytes], list[Msg]], Awaitable[None]]


class Poison(Exception):
    """The message can never be processed (malformed, wrong schema, too large): dead-letter it now."""


class HandlerTimeout(Exception):
    """One attempt of a handler ran past ``PALACE_HANDLER_TIMEOUT_S`` and was cancelled. Not a
    ``TimeoutError``: that would count as a dependency outage and hold the message in place, where
    running the same slow work again at once is what the budget is there to stop."""


@dataclass(frozen=True)
class Consumer:
    """One durable pull consumer, shared by every replica of its service."""

    durable: str
    subject: str
    service: str
    batch: bool = False  # the handler takes a list (embed: one model call for many drawers)
    # A batch handler whose work is database round trips, not one CPU-bound call, runs several batches
    # at once (the service's window): one slow batch (an LLM label) does not hold up the rest. A service
    # may narrow that window for its process where its configuration decides (``Deps.windows``).
    parallel_batches: bool = False


# The single declaration of every consumer. Streams, consumers, services, lag and age gauges, the
# re-drive path and the deployment's autoscalers all read it.
CONSUMERS: tuple[Consumer, ...] = (
    Consumer("ingest", "session.completed", "ingest"),
    Consumer("embed", "drawer.created", "embed", batch=True),
    Consumer("classify", "drawer.embedded", "classify", batch=True, parallel_batches=True),
    Consumer("cluster", "drawer.classified", "cluster"),
    Consumer("cluster-entities", "entity.upserted", "cluster", batch=True, parallel_batches=True),
    Consumer("enrich", "session.stored", "enrich"),
    Consumer("enrich-episode", "drawer.embedded", "enrich"),
    Consumer("enrich-kg", "episodic.created", "enrich", batch=True),
)


def consumer(durable: str) -> Consumer:
    """The consumer named ``durable`` (KeyError for an unknown name: a typo must fail loudly)."""
    for c in CONSUMERS:
        if c.durable == durable:
            return c
    raise KeyError(durable)


def consumer_for(service: str, subject: str) -> Consumer:
    """The consumer through which ``service`` reads ``subject`` (a service reads each subject through
    one consumer), so handlers name the event they take and never restate a durable's name."""
    found = [c for c in CONSUMERS if c.service == service and c.subject == subject]
    if len(found) != 1:
        raise KeyError(f"{service} has {len(found)} consumers of {subject}; CONSUMERS must declare exactly one")
    return found[0]


def consumers_of(service: str) -> list[Consumer]:
    return [c for c in CONSUMERS if c.service == service]


def pipeline_subjects() -> list[str]:
    """Every subject of the pipeline stream. Each has a consumer: the stream keeps a message until all
    consumers interested in it have acked it (interest retention), so a subject nobody consumed would
    be dropped on arrival."""
    return list(dict.fromkeys(c.subject for c in CONSUMERS))


def consumer_config(settings: Settings, c: Consumer) -> js_api.ConsumerConfig:
    """Server-side settings of a durable pull consumer.

    ``max_deliver`` is two higher than ours, so a message whose handler crashed the process (no NAK
    sent) is still redelivered, seen past the limit, and dead-lettered instead of silently dropped.
    """
    return js_api.ConsumerConfig(
        durable_name=c.durable,
        filter_subject=c.subject,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        deliver_policy=js_api.DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        max_deliver=settings.max_deliver + 2,
        max_ack_pending=settings.max_ack_pending,
    )


async def oldest_unacked_age_s(js: Any, stream: str, durable: str) -> float:
    """Age (seconds since it was published) of the oldest message this consumer has not acked yet,
    delivered or not; 0 when it has acked everything.

    Consumer lag counts only undelivered messages: a message fetched by a client that then lost it
    counts as delivered, so a stall hides behind a lag of zero. The ack floor does not move past it,
    so the first message after the floor shows how long the consumer has been stuck.
    """
    info = await js.consumer_info(stream, durable)
    if not (info.num_pending or 0) and not (info.num_ack_pending or 0):
        return 0.0
    floor = info.ack_floor.stream_seq if info.ack_floor and info.ack_floor.stream_seq else 0
    try:
        msg = await js.get_msg(stream, seq=floor + 1, subject=info.config.filter_subject, next=True)
    except NotFoundError:
        return 0.0
    if msg.time is None:
        return 0.0
    return max(0.0, time.time() - msg.time.timestamp())


class PullConsumer:
    """Feeds one durable consumer's messages to a handler, at most ``window`` at a time."""

    def __init__(self, *, js: Any, broker: Any, settings: Settings, c: Consumer,
                 handler: Handler | BatchHandler, dead_letter: Callable[..., Awaitable[None]],
                 window: int | None = None) -> None:
        self.js, self.broker, self.settings, self.c = js, broker, settings, c
        self.handler = handler
        self.dead_letter = dead_letter
        # A batch consumer runs one batch at a time (its handler already amortises over the batch), unless
        # its batches are parallel: then up to the window's number of batches.
        self.window = 1 if c.batch and not c.parallel_batches else max(1, window or settings.consumer_concurrency)
        self.fetch_size = settings.fetch_batch if c.batch else self.window
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[int, tuple[Msg, float]] = {}  # id(msg) → (msg, started) for heartbeats
        self._inbox_seen: dict[int, float] = {}  # id(msg) → when first seen waiting in the inbox (heartbeats)
        self._slot = asyncio.Event()
        self._sub: Any = None
        self._backoff: Sequence[float] = settings.backoff_s or [1.0]

    # --- the loop --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and dispatch until ``stop``; then wait for in-flight handlers and give back the rest."""
        heartbeat = asyncio.create_task(self._heartbeat(stop))
        try:
            while not stop.is_set():
                if len(self._tasks) >= self.window:
                    self._slot.clear()
                    await _wait_either(self._slot, stop)
                    continue
                msgs = await self._fetch(stop)
                if not msgs:
                    continue
                if self.c.batch:
                    self._spawn(msgs)
                else:
                    for m in msgs:
                        self._spawn([m])
        finally:
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _bind(self) -> Any:
        if self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(
                durable=self.c.durable, stream=self.settings.stream_name,
            )
        return self._sub

    async def _fetch(self, stop: asyncio.Event) -> list[Msg]:
        """Up to as many messages as there are free slots. A lingering fetch of one returns as soon as
        a message arrives; a short second fetch then takes whatever else is already waiting."""
        free = self.window - len(self._tasks) if not self.c.batch else self.fetch_size
        try:
            sub = await self._bind()
            # nats-py raises nats.errors.TimeoutError (a subclass of the builtin) on some paths and
            # the builtin asyncio.TimeoutError on others: catch the builtin, which covers both.
            waiting = asyncio.create_task(sub.fetch(batch=1, timeout=self.settings.fetch_wait_s))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not waiting.done():
                # Stopping: a message that still arrives for this request lands in the inbox, and the
                # drain hands it back.
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await waiting
                return []
            try:
                first = waiting.result()
            except TimeoutError:
                return []
            if free <= 1 or stop.is_set():
                return first
            try:
                more = await sub.fetch(batch=free - 1, timeout=self.settings.fetch_linger_s)
            except TimeoutError:
                more = []
            except Exception as e:
                # The first is ours already (delivered to this subscription): dropping it here would leave
                # it to wait out ack_wait. It goes on; the failure shows again at the next fetch.
                log.warning("fetch_failed", consumer=self.c.durable, error=repr(e)[:300], kept=len(first))
                more = []
            return first + more
        except asyncio.CancelledError:
            raise
        except NotFoundError:
            # The consumer was deleted under us (an operator, a stream reset): declare it again.
            log.warning("consumer_missing", consumer=self.c.durable)
            with contextlib.suppress(Exception):
                await self.js.add_consumer(self.settings.stream_name, consumer_config(self.settings, self.c))
            await self._unbind()
        except Exception as e:
            # Disconnected, reconnecting, JetStream unavailable: nothing was fetched, nothing is lost.
            log.warning("fetch_failed", consumer=self.c.durable, error=repr(e)[:300])
        await _sleep_or_stop(stop, 1.0)
        return []

    async def _unbind(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    def _spawn(self, msgs: list[Msg]) -> None:
        task = asyncio.create_task(self._process(msgs), name=f"{self.c.durable}-handler")
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self._slot.set()
            if not t.cancelled() and t.exception() is not None:  # _process settles everything itself
                log.error("handler_task_crashed", consumer=self.c.durable, exc_info=t.exception())

        task.add_done_callback(done)

    async def _drain(self) -> None:
        """Graceful stop: in-flight handlers finish (commit, then ack) within the grace period;
        messages that reached our inbox after the last fetch are NAKed for another replica now."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=self.settings.shutdown_grace_s)
            for t in pending:
                t.cancel()
            if pending:  # each NAKs its message(s) as it unwinds (``_settle``)
                await asyncio.wait(pending, timeout=5.0)
        sub = self._sub
        if sub is not None:
            queue = sub._sub._pending_queue
            while not queue.empty():
                m = queue.get_nowait()
                if m.data and m.reply:
                    with contextlib.suppress(Exception):
                        await m.nak()
        await self._unbind()

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Tell JetStream that messages in a handler are still being worked on (``+WPI``), so ``ack_wait``
        expires only for a consumer that died, not for one waiting on a slow dependency. An attempt is kept
        alive for ``handler_timeout_s``, the budget ``_call_holding`` cancels it at: JetStream can only
        redeliver a message after its handler stopped, so one message never runs twice at once."""
        every = max(0.2, self.settings.ack_wait_s / 3)
        give_up = self.settings.handler_timeout_s
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for msg, started in list(self._live.values()):
                if not msg._ackd and now - started < give_up:
                    with contextlib.suppress(Exception):  # a lost heartbeat only risks a redelivery
                        await msg.in_progress()
            for msg, seen in self._inbox(now):
                if now - seen < give_up:
                    with contextlib.suppress(Exception):
                        await msg.in_progress()

    def _inbox(self, now: float) -> list[tuple[Msg, float]]:
        """Messages delivered to this subscription that no fetch has taken yet, and since when each waits.
        The server answers a fetch that the client has already given up on: its message lands in the inbox,
        delivered, and the next fetch takes it first. While every slot is busy (a batch longer than
        ``ack_wait``) that fetch does not come, and without a heartbeat JetStream would hand the message to
        another replica while it still waits here: the same work twice, and a delivery used up."""
        sub = self._sub
        queue = getattr(getattr(sub, "_sub", None), "_pending_queue", None)
        waiting = [m for m in list(getattr(queue, "_queue", ())) if m.data and m.reply and not m._ackd]
        seen = {id(m): self._inbox_seen.get(id(m), now) for m in waiting}
        self._inbox_seen = seen
        return [(m, seen[id(m)]) for m in waiting]

    # --- one unit of work ------------------------------------------------------------------------
    async def _process(self, raws: list[Msg]) -> None:
        """One message (or batch) inside its CONSUMER span(s), children of the trace context the
        message(s) arrived with: what the handler logs and publishes continues that trace."""
        with tracing.consuming(self.c.durable, self.c.subject, raws) as spans:
            await self._settle(raws, spans)

    async def _settle(self, raws: list[Msg], spans: list[Any]) -> None:
        s, service, subject = self.settings, self.c.service, self.c.subject
        over = [r for r in raws if r.metadata.num_delivered > s.max_deliver]
        for r in over:
            await self._settle_dead(r, "crash", f"exceeded {s.max_deliver} deliveries without an outcome "
                                                "(the handler likely crashed the process)")
        raws = [r for r in raws if r not in over]
        if not raws:
            return
        started = time.monotonic()
        for r in raws:
            self._live[id(r)] = (r, started)
        metrics.IN_FLIGHT.labels(service).inc(len(raws))
        t0 = time.perf_counter()
        try:
            await self._call_holding(raws)
        except asyncio.CancelledError:
            # Cut by a stop that outlasted the grace period: its transaction rolled back; handed back now, to
            # another replica, not after ack_wait.
            for r in raws:
                if not r._ackd:
                    with contextlib.suppress(Exception):
                        await r.nak()
            raise
        except Exception as e:
            if isinstance(e, Poison):
                tracing.record_failure(spans, e, "dead_lettered")
                for r in raws:
                    if not r._ackd:
                        await self._settle_dead(r, "invalid", str(e))
                return
            metrics.FAILED.labels(service, subject, type(e).__name__).inc(len(raws))
            tracing.record_failure(spans, e, "failed")
            log.warning("handler_failed", service=service, subject=subject, error=repr(e)[:500],
                        deliveries=[r.metadata.num_delivered for r in raws], exc_info=e)
            for r in raws:
                if r._ackd:
                    continue
                n = r.metadata.num_delivered
                if n >= s.max_deliver:
                    await self._settle_dead(r, type(e).__name__, f"{type(e).__name__}: {e}")
                else:
                    with contextlib.suppress(Exception):
                        await r.nak(delay=self._backoff[min(n - 1, len(self._backoff) - 1)])
            return
        finally:
            for r in raws:
                self._live.pop(id(r), None)
            metrics.IN_FLIGHT.labels(service).dec(len(raws))
            metrics.HANDLER_SECONDS.labels(service, subject).observe(time.perf_counter() - t0)
        for r in raws:
            if not r._ackd:
                await r.ack()
        metrics.PROCESSED.labels(service, subject).inc(len(raws))
        # One line per handled message (per batch for a batch handler): with the log context bound by
        # the loop and decode_event, it ties each event to its trace, workspace and outcome.
        log.info("handled", consumer=self.c.durable, subject=subject, messages=len(raws),
                 ms=round((time.perf_counter() - t0) * 1000, 1))

    async def _call_holding(self, raws: list[Msg]) -> None:
        """Run the handler; while a dependency is down, keep the message(s) and retry in place: an
        outage must not use up a good message's attempts and dead-letter it. Each attempt has
        ``handler_timeout_s``; past it the attempt is cancelled (an open transaction rolls back) and
        ``HandlerTimeout`` raised, so the message is retried with backoff like any failure, never
        redelivered while this attempt still runs (``_heartbeat`` keeps it alive exactly as long)."""
        s = self.settings
        hold_until = time.monotonic() + s.dependency_wait_s
        waits = 0
        while True:
            now = time.monotonic()
            for r in raws:
                self._live[id(r)] = (r, now)
            try:
                async with asyncio.timeout(s.handler_timeout_s) as budget:
                    if self.c.batch:
                        await self.handler([r.data for r in raws], raws)  # type: ignore[call-arg,arg-type]
                    else:
                        await self.handler(raws[0].data, raws[0])  # type: ignore[call-arg,arg-type]
                return
            except Exception as e:
                if isinstance(e, TimeoutError) and budget.expired():
                    metrics.HANDLER_TIMEOUTS.labels(self.c.service, self.c.subject).inc()
                    raise HandlerTimeout(f"the handler ran past PALACE_HANDLER_TIMEOUT_S ({s.handler_timeout_s:g} s) "
                                         "and was cancelled") from None
                if isinstance(e, Poison) or not is_transient(e) or time.monotonic() >= hold_until:
                    raise
                waits += 1
                metrics.DEPENDENCY_WAITS.labels(self.c.service, dependency_of(e), type(e).__name__).inc()
                log.warning("dependency_unavailable", service=self.c.service, subject=self.c.subject,
                            error=repr(e)[:300], wait=waits)
                for r in raws:
                    if not r._ackd:
                        with contextlib.suppress(Exception):
                            await r.in_progress()
                delay = min(s.dependency_retry_max_s, 0.25 * 2 ** min(waits, 8))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _settle_dead(self, raw: Msg, error_type: str, reason: str) -> None:
        """Dead-letter, then ack; never ack a message whose dead letter was not stored. While NATS cannot
        take the dead letter (reconnecting, a publish timing out) it is published again in place, the
        message kept alive meanwhile, as ``_call_holding`` holds a handler (the dead letter's message id
        makes a repeat harmless). One that still fails is left un-acked: JetStream delivers it again while
        its attempts last, where acking it would have lost it from both streams."""
        hold_until = time.monotonic() + self.settings.dependency_wait_s
        waits = 0
        while True:
            try:
                await self.dead_letter(self.broker, self.settings, service=self.c.service, raw=raw, reason=reason,
                                       error_type=error_type)
                break
            except Exception as e:
                if not is_transient(e) or time.monotonic() >= hold_until:
                    log.error("dead_letter_failed", service=self.c.service, subject=self.c.subject,
                              deliveries=raw.metadata.num_delivered, error=repr(e)[:300], exc_info=e)
                    return
                waits += 1
                with contextlib.suppress(Exception):
                    await raw.in_progress()
                delay = min(self.settings.dependency_retry_max_s, 0.25 * 2 ** min(waits, 8))
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
        await raw.ack()


async def _wait_either(event: asyncio.Event, stop: asyncio.Event) -> None:
    waiters = [asyncio.create_task(event.wait()), asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
