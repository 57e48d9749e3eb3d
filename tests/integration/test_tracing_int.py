"""Traces end to end on the real stack: a session published with a known ``traceparent`` keeps that
trace through ingest, embed, classify, cluster and enrich (in the derived events' NATS headers, in every
service's JSON log lines, and in the spans the services export over OTLP to a receiver in the test
process); the API continues a caller's trace; an event without one gets a new trace at ingest."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from shared.events.models import msg_id_event
from tests.integration.helpers import Stack, session, wait_for, ws

TEXTS = [
    "We decided to run the billing service on PostgreSQL with pgvector, not a separate vector store.",
    "My partner Ana is training for the Berlin marathon in September.",
]
SERVICES = ("ingest", "embed", "classify", "cluster", "enrich")


class Tap:
    """A core NATS subscription (in a thread of its own) to the pipeline's subjects: it sees every
    event as published, headers included, even after the interest-retention stream has dropped it."""

    def __init__(self, url: str) -> None:
        self.got: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._url = url

    async def _sub(self) -> None:
        self._nc = await nats.connect(self._url)

        async def cb(m: Any) -> None:
            self.got.append((m.subject, dict(m.headers or {}), json.loads(m.data)))

        for subject in ("session.>", "drawer.>", "episodic.>", "entity.>"):
            await self._nc.subscribe(subject, cb=cb)
        await self._nc.flush()

    def __enter__(self) -> Tap:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._sub(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._nc.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def of(self, workspace: str) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
        return [g for g in list(self.got) if g[2].get("workspace_id") == workspace]


@pytest.fixture
def tap(stack: Stack) -> Iterator[Tap]:
    with Tap(stack.nats_url) as t:
        yield t


def _trace_of(headers: dict[str, str]) -> str | None:
    tp = headers.get("traceparent")
    return tp.split("-")[1] if tp else None


def _log_lines(stack: Stack, trace_id: str) -> list[dict[str, Any]]:
    out = []
    for path in Path(stack.settings.devstack_dir, "logs").glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if trace_id in line and line.startswith("{"):
                rec = json.loads(line)
                if rec.get("trace_id") == trace_id or trace_id in rec.get("trace_ids", []):
                    out.append(rec)
    return out


def test_a_publishers_trace_runs_through_every_service_into_logs_and_spans(stack: Stack, tap: Tap) -> None:
    w, trace_id, parent = ws(), uuid.uuid4().hex, uuid.uuid4().hex[:16]
    event_id = f"trace-{uuid.uuid4().hex[:8]}"
    stack.publish(session(w, "s1", TEXTS, event_id=event_id), headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    stack.wait_processed(w, 2)

    # (a) Every derived event carries the publisher's trace in its NATS headers.
    want = {"drawer.created", "drawer.embedded", "drawer.classified", "session.stored"}
    wait_for(lambda: want <= {s for s, _, _ in tap.of(w)}, 30, f"derived events {want}")
    derived = [(s, h) for s, h, _ in tap.of(w) if s != "session.completed"]
    assert derived and all(_trace_of(h) == trace_id for _, h in derived), derived

    # (b) Each service's lines for the event name the service, the trace, the workspace and the event.
    def handled() -> dict[str, list[dict[str, Any]]]:
        by: dict[str, list[dict[str, Any]]] = {}
        for rec in _log_lines(stack, trace_id):
            if rec.get("event") == "handled":
                by.setdefault(rec.get("service", "?"), []).append(rec)
        return by if set(SERVICES) <= set(by) else {}

    lines = wait_for(handled, 30, "a 'handled' line from every service")
    ingest = lines["ingest"][0]
    assert (ingest["workspace_id"], ingest["event_id"], ingest["trace_id"]) == (w, event_id, trace_id)
    assert len(ingest["span_id"]) == 16 and ingest["span_id"] != parent
    # Read the tap again: events derived after (a) looked (entity.upserted follows the episode) were
    # handled too, and are in the tap by the time their handler logged.
    def derived_ids_now() -> set[str]:
        return {msg_id_event(s, h["Nats-Msg-Id"]) for s, h, _ in tap.of(w) if s != "session.completed"}

    handled_ids = {rec["event_id"] for svc in SERVICES[1:] for rec in lines[svc] if rec["messages"] == 1}
    derived_ids = wait_for(lambda: (ids := derived_ids_now()) >= handled_ids and ids, 10,
                           "the handled events in the tap")
    assert all(_trace_of(h) == trace_id for s, h, _ in tap.of(w) if s != "session.completed")
    for svc in SERVICES[1:]:
        for rec in lines[svc]:
            if rec["messages"] == 1:  # a batch of many events names none of them
                assert rec["workspace_id"] == w and rec["event_id"] in derived_ids, rec
    assert all(rec["messages"] > 1 or rec["workspace_id"] == w for svc in SERVICES for rec in lines[svc])

    # (c) The spans arrived over OTLP: a CONSUMER span per service, the first the child of the publisher's.
    assert stack.otlp is not None
    def connected(spans: list[Any]) -> list[Any] | None:
        # Each service exports its spans in its own batches, so a child can reach the receiver before its
        # parent does: wait until the spans of every service form one tree whose only outside parent is
        # the publisher's, or give up and show what came.
        ids = {s.span_id for s in spans}
        orphans = {s.parent_span_id for s in spans if s.parent_span_id not in ids}
        return spans if set(SERVICES) <= {x.service for x in spans} and orphans == {parent} else None

    # The spans the wait saw connected (a batch arriving after it may hold a child whose parent is still
    # in another service's unsent batch).
    got = wait_for(lambda: connected(stack.otlp.of_trace(trace_id)), 30,
                   "one connected tree of spans from every service")
    ingest_span = next(s for s in got if s.service == "ingest" and s.name == "session.completed process")
    assert ingest_span.parent_span_id == parent and ingest_span.kind == 5  # SPAN_KIND_CONSUMER
    ids = {s.span_id for s in got}
    assert all(s.parent_span_id in ids for s in got if s is not ingest_span), got
    assert {"drawer.created publish", "drawer.embedded publish", "drawer.classified publish"} <= {s.name for s in got}


def test_the_api_continues_the_callers_trace(stack: Stack, tap: Tap) -> None:
    w, trace_id, parent = ws(), uuid.uuid4().hex, uuid.uuid4().hex[:16]
    r = httpx.post(f"{stack.api_url}/v1/sessions", json=session(w, "s1", TEXTS[:1], event_id=f"api-{w}"),
                   headers={"traceparent": f"00-{trace_id}-{parent}-01"}, timeout=30)
    assert r.status_code == 202, r.text
    stack.wait_processed(w, 1)
    wait_for(lambda: {"session.completed", "drawer.created"} <= {s for s, _, _ in tap.of(w)}, 30, "events")
    assert all(_trace_of(h) == trace_id for _, h, _ in tap.of(w))
    assert stack.otlp is not None
    # The api's server span ends after its response, and each process exports its spans in batches: it
    # can arrive after the api's publish span and ingest's, so the wait is for that span itself.
    got = wait_for(lambda: (lambda s: s if "ingest" in {x.service for x in s}
                            and any(x.service == "api" and x.kind == 2 for x in s) else None)(  # SPAN_KIND_SERVER
        stack.otlp.of_trace(trace_id)), 30, "the api's server span and ingest's spans")
    server = next(s for s in got if s.service == "api" and s.kind == 2)
    assert server.parent_span_id == parent and server.name == "POST /v1/sessions"


def test_an_event_without_a_trace_gets_one_at_ingest(stack: Stack, tap: Tap) -> None:
    w = ws()
    stack.publish(session(w, "s1", TEXTS[1:], event_id=f"notrace-{w}"))
    stack.wait_processed(w, 1)
    wait_for(lambda: "drawer.classified" in {s for s, _, _ in tap.of(w)}, 30, "derived events")
    traces = {_trace_of(h) for s, h, _ in tap.of(w) if s != "session.completed"}
    assert len(traces) == 1 and None not in traces
    (trace_id,) = traces
    assert trace_id is not None
    lines = wait_for(lambda: [r for r in _log_lines(stack, trace_id) if r.get("service") == "ingest"], 30,
                     "ingest's lines in the new trace")
    assert lines[0]["event_id"] == f"notrace-{w}" and lines[0]["workspace_id"] == w
