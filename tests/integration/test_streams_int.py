"""Stream retention never discards an event a consumer has not processed; every consumer exists before
anything is published; the duplicate window is the configured one."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import nats
import nats.js.api as js_api
import pytest
from nats.js.errors import APIError, NotFoundError

from shared.bus import stream_configs
from shared.consumers import CONSUMERS, pipeline_subjects
from tests.integration.helpers import Stack, session, wait_for, ws

pytestmark = pytest.mark.integration


async def _stream(stack: Stack, name: str) -> js_api.StreamInfo:
    nc = await nats.connect(stack.nats_url)
    try:
        return await nc.jetstream().stream_info(name)
    finally:
        await nc.close()


def test_pipeline_stream_keeps_events_until_processed(stack: Stack) -> None:
    si = asyncio.run(_stream(stack, stack.settings.stream_name))
    cfg = si.config
    assert cfg.retention == js_api.RetentionPolicy.INTEREST
    assert not cfg.max_age  # no age limit: a slow or stopped consumer never loses events
    assert cfg.discard == js_api.DiscardPolicy.NEW  # full: refuse new events, never drop old ones
    assert cfg.max_bytes == stack.settings.stream_max_bytes
    assert cfg.duplicate_window == stack.settings.duplicate_window_s
    assert sorted(cfg.subjects or []) == sorted(pipeline_subjects())
    dlq = asyncio.run(_stream(stack, stack.settings.dlq_stream_name)).config
    assert not dlq.max_age and dlq.discard == js_api.DiscardPolicy.NEW


def test_every_consumer_is_declared_on_the_stream(stack: Stack) -> None:
    async def go() -> dict[str, str]:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            return {c.durable: (await js.consumer_info(stack.settings.stream_name, c.durable)).config.filter_subject
                    for c in CONSUMERS}
        finally:
            await nc.close()

    assert asyncio.run(go()) == {c.durable: c.subject for c in CONSUMERS}


def test_a_processed_event_leaves_the_stream(stack: Stack) -> None:
    """Interest retention: once every consumer of its subject acked it, the stream drops it."""
    w = ws()

    async def publish() -> int:
        nc = await nats.connect(stack.nats_url)
        try:
            ack = await nc.jetstream().publish("session.completed", json.dumps(session(w, "s1", [
                "The quarterly planning offsite moved to the Lisbon office."])).encode())
            return ack.seq
        finally:
            await nc.close()

    seq = asyncio.run(publish())
    stack.wait_processed(w, 1)

    async def gone() -> bool:
        nc = await nats.connect(stack.nats_url)
        try:
            await nc.jetstream().get_msg(stack.settings.stream_name, seq)
            return False
        except NotFoundError:
            return True
        finally:
            await nc.close()

    wait_for(lambda: asyncio.run(gone()), 30, "the acked event to leave the stream")


def test_a_full_stream_refuses_new_events_and_keeps_the_old(stack: Stack) -> None:
    """Our stream settings on a small copy: at the size limit a publish fails (the producer knows), and
    nothing already stored is discarded."""
    name = f"FULL{uuid.uuid4().hex[:6].upper()}"
    small = dataclasses.replace(stream_configs(stack.settings)[0], name=name, subjects=[f"{name.lower()}.x"],
                                max_bytes=4096)

    async def go() -> tuple[int, int, bool]:
        nc = await nats.connect(stack.nats_url)
        try:
            js = nc.jetstream()
            await js.add_stream(small)
            slow = js_api.ConsumerConfig(durable_name="slow", ack_policy=js_api.AckPolicy.EXPLICIT)
            await js.add_consumer(name, slow)
            stored, refused = 0, False
            for i in range(100):
                try:
                    await js.publish(f"{name.lower()}.x", f"event {i} ".encode() * 20)
                    stored += 1
                except APIError:
                    refused = True
                    break
            info = await js.stream_info(name)
            first = info.state.first_seq
            await js.delete_stream(name)
            return stored, first, refused
        finally:
            await nc.close()

    stored, first, refused = asyncio.run(go())
    assert refused and 0 < stored < 100
    assert first == 1  # the oldest, unprocessed event is still there
