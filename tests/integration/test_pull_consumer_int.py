"""The pull loop against real JetStream: no fetched message is ever lost to a fetch error, handlers run
within a bounded window, outcomes are acks/NAKs/dead letters, and the oldest-un-acked gauge sees a stall.

Each test uses a stream of its own, so the pipeline's stream and services are untouched."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import nats
import nats.js.api as js_api
import pytest

from shared.config import Settings
from shared.consumers import Consumer, Poison, PullConsumer, consumer_config, oldest_unacked_age_s
from tests.integration.helpers import Stack

pytestmark = pytest.mark.integration


class _FlakyFetch:
    """A pull subscription whose fetch raises the *builtin* ``asyncio.TimeoutError`` every other call,
    sometimes after the server has already sent messages for that call — what nats-py's ``_fetch_n``
    does, and what made FastStream drop fetched messages until ``ack_wait`` redelivered them."""

    def __init__(self, sub: Any) -> None:
        self._inner, self._sub, self.calls = sub, sub._sub, 0

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Any]:  # noqa: ASYNC109 - nats-py's API
        self.calls += 1
        if self.calls % 2 == 0:
            raise TimeoutError  # the builtin (asyncio.TimeoutError),, not nats.errors.TimeoutError
        return list(await self._inner.fetch(batch=batch, timeout=timeout))

    async def unsubscribe(self) -> None:
        await self._inner.unsubscribe()


async def _setup(stack: Stack, **overrides: Any) -> tuple[Any, Any, Settings, Consumer]:
    name = f"T{uuid.uuid4().hex[:8].upper()}"
    settings = Settings(**{**stack.settings.model_dump(), "stream_name": name, "ack_wait_s": 60.0,
                           "max_deliver": 3, "backoff_s": [0.1], **overrides})
    nc = await nats.connect(stack.nats_url)
    js = nc.jetstream()
    await js.add_stream(js_api.StreamConfig(name=name, subjects=[f"{name.lower()}.work"]))
    c = Consumer(durable="worker", subject=f"{name.lower()}.work", service="test")
    await js.add_consumer(name, consumer_config(settings, c))
    return nc, js, settings, c


async def _until(pred: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.05)


async def _dead_letter(broker: Any, settings: Settings, *, raw: Any, reason: str, error_type: str,
                       service: str) -> None:
    broker.append((raw.data, error_type, reason))


async def test_a_fetch_error_never_loses_fetched_messages(stack: Stack) -> None:
    nc, js, settings, c = await _setup(stack, consumer_concurrency=4, fetch_wait_s=0.5)
    seen: dict[bytes, float] = {}
    running = peak = 0

    async def handler(body: bytes, raw: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        seen.setdefault(body, time.monotonic())
        running -= 1

    pc = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    pc._sub = _FlakyFetch(await js.pull_subscribe_bind(durable=c.durable, stream=settings.stream_name))
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    try:
        sent: dict[bytes, float] = {}
        for i in range(200):
            body = f"m{i}".encode()
            sent[body] = time.monotonic()
            await js.publish(c.subject, body)
            if i % 20 == 0:
                await asyncio.sleep(0.05)
        await _until(lambda: len(seen) >= len(sent), 20)
    finally:
        stop.set()
        await task
    assert set(seen) == set(sent), f"lost {len(set(sent) - set(seen))} of {len(sent)}"
    slowest = max(seen[b] - sent[b] for b in sent)
    assert slowest < 5, f"a message waited {slowest:.1f}s: something sat fetched but unhandled until redelivery"
    assert 1 < peak <= 4, f"handlers ran {peak} at once; the window is 4"
    # An ack is a publish nobody waits for: the server counts the last ones a moment after the handlers end.
    await nc.flush()
    deadline = time.monotonic() + 5
    while True:
        info = await js.consumer_info(settings.stream_name, c.durable)
        if (info.num_ack_pending == 0 and info.num_pending == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await nc.close()


async def test_outcomes_ack_nak_and_dead_letter(stack: Stack) -> None:
    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.5)
    attempts: dict[bytes, int] = {}

    async def handler(body: bytes, raw: Any) -> None:
        attempts[body] = attempts.get(body, 0) + 1
        if body == b"poison":
            raise Poison("not an event")
        if body == b"flaky" and attempts[body] < 2:
            raise RuntimeError("first attempt fails")
        if body == b"always":
            raise RuntimeError("never works")

    dead: list[Any] = []
    pc = PullConsumer(js=js, broker=dead, settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    try:
        for body in (b"ok", b"poison", b"flaky", b"always"):
            await js.publish(c.subject, body)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            info = await js.consumer_info(settings.stream_name, c.durable)
            if len(dead) == 2 and not info.num_ack_pending and not info.num_pending:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task
    assert sorted((d[0], d[1]) for d in dead) == [(b"always", "RuntimeError"), (b"poison", "invalid")]
    assert attempts == {b"ok": 1, b"poison": 1, b"flaky": 2, b"always": 3}
    await nc.close()


async def test_a_message_past_its_delivery_limit_is_dead_lettered_unprocessed(stack: Stack) -> None:
    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.5, ack_wait_s=1.0)
    await js.publish(c.subject, b"crashes-the-process")
    # Three deliveries that died without a NAK (a process killed mid-handler): fetch, never answer.
    sub = await js.pull_subscribe_bind(durable=c.durable, stream=settings.stream_name)
    for _ in range(settings.max_deliver):
        msgs = await sub.fetch(1, timeout=5)
        assert msgs[0].metadata.num_delivered <= settings.max_deliver
        await asyncio.sleep(1.3)  # past ack_wait: JetStream redelivers
    await sub.unsubscribe()
    handled: list[bytes] = []

    async def handler(body: bytes, raw: Any) -> None:
        handled.append(body)

    dead: list[Any] = []
    pc = PullConsumer(js=js, broker=dead, settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    await _until(lambda: bool(dead), 10)
    stop.set()
    await task
    assert handled == [] and [d[1] for d in dead] == ["crash"]
    await nc.close()


class _SecondFetchFails:
    """A pull subscription whose short second fetch (the rest of a window, after the first message came)
    fails as it does while NATS restarts: JetStream answers 503."""

    def __init__(self, sub: Any) -> None:
        self._inner, self._sub = sub, sub._sub

    async def fetch(self, batch: int = 1, timeout: float | None = 5) -> list[Any]:  # noqa: ASYNC109 - nats-py's API
        if batch > 1:
            from nats.js.errors import ServiceUnavailableError

            raise ServiceUnavailableError
        return list(await self._inner.fetch(batch=batch, timeout=timeout))

    async def unsubscribe(self) -> None:
        await self._inner.unsubscribe()


async def test_a_failed_second_fetch_keeps_the_message_the_first_brought(stack: Stack) -> None:
    """The first message is delivered to this subscription already: dropped with the second fetch's
    error, it would wait out ack_wait (60 s here) behind a consumer that shows no lag."""
    nc, js, settings, c = await _setup(stack, consumer_concurrency=4, fetch_wait_s=0.5)
    seen: dict[bytes, float] = {}

    async def handler(body: bytes, raw: Any) -> None:
        seen.setdefault(body, time.monotonic())

    pc = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    pc._sub = _SecondFetchFails(await js.pull_subscribe_bind(durable=c.durable, stream=settings.stream_name))
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    try:
        sent = time.monotonic()
        await js.publish(c.subject, b"one")
        await _until(lambda: b"one" in seen, 10)
    finally:
        stop.set()
        await task
    assert b"one" in seen and seen[b"one"] - sent < 5
    await nc.close()


async def test_a_dead_letter_nats_cannot_take_yet_is_held_then_stored_before_the_ack(stack: Stack) -> None:
    """A dead letter published while NATS is reconnecting is published again in place, the message kept
    alive meanwhile; it is acked only once its dead letter is stored. One whose dead letter fails for
    another reason is not acked: JetStream delivers it again, and it is dead-lettered then."""
    from nats.errors import ConnectionReconnectingError

    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.5, ack_wait_s=2.0, dependency_retry_max_s=0.2)
    calls: dict[bytes, int] = {}

    async def flaky_dead_letter(broker: Any, settings: Settings, *, raw: Any, reason: str, error_type: str,
                                service: str) -> None:
        calls[raw.data] = calls.get(raw.data, 0) + 1
        if raw.data == b"reconnecting" and calls[raw.data] <= 2:
            raise ConnectionReconnectingError
        if raw.data == b"refused" and calls[raw.data] == 1:
            raise RuntimeError("the dead-letter stream refused it")
        broker.append((raw.data, raw.metadata.num_delivered))

    async def handler(body: bytes, raw: Any) -> None:
        raise Poison("not an event")

    dead: list[Any] = []
    pc = PullConsumer(js=js, broker=dead, settings=settings, c=c, handler=handler, dead_letter=flaky_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    try:
        await js.publish(c.subject, b"reconnecting")
        await js.publish(c.subject, b"refused")
        await _until(lambda: len(dead) == 2, 30)
        await asyncio.sleep(2.5)  # past ack_wait: anything left un-acked would come back
    finally:
        stop.set()
        await task
    # Held in place on its first delivery; the other one came back once and was dead-lettered then.
    assert sorted(dead) == [(b"reconnecting", 1), (b"refused", 2)]
    assert calls == {b"reconnecting": 3, b"refused": 2}
    info = await js.consumer_info(settings.stream_name, c.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await nc.close()


async def test_oldest_unacked_age_sees_a_message_held_without_ack(stack: Stack) -> None:
    nc, js, settings, c = await _setup(stack)
    assert await oldest_unacked_age_s(js, settings.stream_name, c.durable) == 0.0
    await js.publish(c.subject, b"held")
    sub = await js.pull_subscribe_bind(durable=c.durable, stream=settings.stream_name)
    msgs = await sub.fetch(1, timeout=5)  # delivered, never acked: lag is 0 from here on
    await asyncio.sleep(1.5)
    info = await js.consumer_info(settings.stream_name, c.durable)
    assert info.num_pending == 0
    age = await oldest_unacked_age_s(js, settings.stream_name, c.durable)
    assert 1.0 <= age < 30
    await msgs[0].ack_sync()
    assert await oldest_unacked_age_s(js, settings.stream_name, c.durable) == 0.0
    await nc.close()


async def test_a_handler_past_its_budget_is_cancelled_never_run_twice_at_once(stack: Stack) -> None:
    """An attempt that outlives PALACE_HANDLER_TIMEOUT_S is cancelled where the heartbeat stops keeping its
    message alive: JetStream redelivers it only after, so two attempts never overlap. Each timed-out attempt
    uses one delivery; the last is dead-lettered with the reason. A fast message beside it is unaffected."""
    # ack_wait 3 s (heartbeats every second): a pause of the test process shorter than 2 s (a loaded CI
    # machine) cannot let JetStream hand the message out again while its attempt still runs.
    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.3, ack_wait_s=3.0, handler_timeout_s=6.0,
                                       consumer_concurrency=2)
    running: dict[bytes, int] = {}
    overlap = 0
    attempts: dict[bytes, int] = {}
    cancelled = 0

    async def handler(body: bytes, raw: Any) -> None:
        nonlocal overlap, cancelled
        attempts[body] = attempts.get(body, 0) + 1
        running[body] = running.get(body, 0) + 1
        overlap = max(overlap, running[body])
        try:
            if body == b"slow":
                await asyncio.sleep(30)  # an LLM that never answers in time
        except asyncio.CancelledError:
            cancelled += 1
            raise
        finally:
            running[body] -= 1

    dead: list[Any] = []
    pc = PullConsumer(js=js, broker=dead, settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    try:
        await js.publish(c.subject, b"slow")
        await js.publish(c.subject, b"fast")
        await _until(lambda: len(dead) == 1, 90)
    finally:
        stop.set()
        await task
    assert overlap == 1, "an attempt ran while the one before it still did"
    assert attempts == {b"slow": 3, b"fast": 1} and cancelled == 3
    assert [(d[0], d[1]) for d in dead] == [(b"slow", "HandlerTimeout")] and "PALACE_HANDLER_TIMEOUT_S" in dead[0][2]
    info = await js.consumer_info(settings.stream_name, c.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await nc.close()


async def test_a_handler_cut_by_a_stop_hands_its_message_back_at_once(stack: Stack) -> None:
    """A stop waits ``shutdown_grace_s`` for handlers, then cancels the rest: their messages are NAKed so
    another replica gets them now, not once ``ack_wait`` has passed."""
    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.3, ack_wait_s=30.0, shutdown_grace_s=0.5)
    got: list[float] = []

    async def slow(body: bytes, raw: Any) -> None:
        got.append(time.monotonic())
        await asyncio.sleep(60)  # an LLM still thinking when the pod is stopped

    async def quick(body: bytes, raw: Any) -> None:
        got.append(time.monotonic())

    first = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=slow, dead_letter=_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(first.run(stop))
    await js.publish(c.subject, b"long job")
    await _until(lambda: len(got) == 1, 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    stopped = time.monotonic()
    second = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=quick, dead_letter=_dead_letter)
    stop2 = asyncio.Event()
    task2 = asyncio.create_task(second.run(stop2))
    try:
        await _until(lambda: len(got) == 2, 15)
    finally:
        stop2.set()
        await task2
    assert len(got) == 2 and got[1] - stopped < 5, "redelivered only after ack_wait"
    await nc.close()


async def test_a_message_left_in_the_inbox_while_every_slot_is_busy_is_kept_alive(stack: Stack) -> None:
    """The server answered a fetch the client had given up on: the message waits in this subscription's inbox,
    delivered, until the next fetch, which does not come while the one slot works on a batch longer than
    ack_wait. Kept alive meanwhile, it is not handed out again: handled once, on its first delivery."""
    nc, js, settings, c = await _setup(stack, fetch_wait_s=0.3, ack_wait_s=3.0, consumer_concurrency=1)
    handled: list[tuple[bytes, int]] = []
    release = asyncio.Event()

    async def handler(body: bytes, raw: Any) -> None:
        handled.append((body, raw.metadata.num_delivered))
        if body == b"long":
            await release.wait()

    pc = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    stop = asyncio.Event()
    task = asyncio.create_task(pc.run(stop))
    # Another replica, idle, pulling all along: where JetStream would hand a message whose ack_wait ran out.
    other = PullConsumer(js=js, broker=[], settings=settings, c=c, handler=handler, dead_letter=_dead_letter)
    other_task: asyncio.Task[None] | None = None
    try:
        await js.publish(c.subject, b"long")
        await _until(lambda: handled, 10)
        # A late answer to a fetch: "late" delivered to the subscription, left in its inbox.
        await js.publish(c.subject, b"late")
        (late,) = await pc._sub.fetch(1, timeout=5)
        pc._sub._sub._pending_queue.put_nowait(late)
        other_task = asyncio.create_task(other.run(stop))
        await asyncio.sleep(3 * settings.ack_wait_s)  # the long batch outlives ack_wait, twice over
        release.set()
        await _until(lambda: len(handled) >= 2, 10)
        await asyncio.sleep(2 * settings.ack_wait_s)  # anything handed out again would come back by now
    finally:
        stop.set()
        await task
        if other_task is not None:
            await other_task
    assert handled == [(b"long", 1), (b"late", 1)], handled
    info = await js.consumer_info(settings.stream_name, c.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0
    await nc.close()
