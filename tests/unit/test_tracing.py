"""Trace context through NATS-style header dicts: inject/extract, a consumer span continuing the
publisher's trace, a batch continuing each message's own trace, and the log context bound per message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from shared import tracing
from shared.bus import decode_event
from shared.config import Settings
from shared.events import DrawerCreated

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TP = f"00-{TRACE}-{PARENT}-01"


@dataclass
class FakeMsg:
    """The two attributes of a nats ``Msg`` the tracing reads."""

    subject: str
    headers: dict[str, str] | None = field(default_factory=dict)


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    provider = tracing.setup_tracing(Settings(), "unit")
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def _trace_of(headers: dict[str, str]) -> str:
    return headers["traceparent"].split("-")[1]


def test_inject_extract_round_trip(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("t").start_as_current_span("publisher") as span:
        headers = tracing.inject({"Nats-Msg-Id": "x"})
    sc = span.get_span_context()
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", trace.format_trace_id(sc.trace_id), trace.format_span_id(sc.span_id))
    assert int(flags, 16) & 1  # sampled
    back = trace.get_current_span(tracing.extract(headers)).get_span_context()
    assert (back.trace_id, back.span_id, back.is_remote) == (sc.trace_id, sc.span_id, True)
    # NATS keeps the sender's header case; a capitalised name must not start a new trace.
    upper = trace.get_current_span(tracing.extract({"Traceparent": TP})).get_span_context()
    assert trace.format_trace_id(upper.trace_id) == TRACE
    # No context, or a malformed one: an empty context, nothing raised.
    assert not trace.get_current_span(tracing.extract(None)).get_span_context().is_valid
    assert not trace.get_current_span(tracing.extract({"traceparent": "garbage"})).get_span_context().is_valid
    assert tracing.inject({}, tracing.extract(None)) == {}


def test_consumer_span_continues_the_publishers_trace_and_binds_the_log_context(spans: InMemorySpanExporter) -> None:
    spans.clear()
    msg = FakeMsg("drawer.created", {"traceparent": TP, "Nats-Msg-Id": "drawer.created:e1"})
    body = DrawerCreated(event_id="e1", workspace_id="w1", drawer_ids=["a" * 32]).model_dump_json().encode()
    with tracing.consuming("embed", "drawer.created", [msg]):
        decode_event(DrawerCreated, body, Settings())
        ctx = structlog.contextvars.get_contextvars()
        assert ctx["trace_id"] == TRACE and ctx["workspace_id"] == "w1" and ctx["event_id"] == "e1"
        out: dict[str, str] = {"Nats-Msg-Id": "drawer.embedded:e2"}
        with tracing.publishing("drawer.embedded", out, event_id="e2"):
            pass
    assert _trace_of(out) == TRACE
    after = structlog.contextvars.get_contextvars()
    assert "workspace_id" not in after and "event_id" not in after and "trace_id" not in after
    done = {s.name: s for s in spans.get_finished_spans()}
    consumer, producer = done["drawer.created process"], done["drawer.embedded publish"]
    assert consumer.kind == SpanKind.CONSUMER and producer.kind == SpanKind.PRODUCER
    assert consumer.parent is not None and trace.format_span_id(consumer.parent.span_id) == PARENT
    assert producer.parent is not None and producer.parent.span_id == consumer.context.span_id
    assert out["traceparent"].split("-")[2] == trace.format_span_id(producer.context.span_id)


def test_without_a_traceparent_a_new_trace_starts(spans: InMemorySpanExporter) -> None:
    with tracing.consuming("ingest", "session.completed", [FakeMsg("session.completed", None)]) as opened:
        out = tracing.inject({})
    sc = opened[0].get_span_context()
    assert sc.is_valid and _trace_of(out) == trace.format_trace_id(sc.trace_id) != TRACE


def test_a_batch_continues_each_messages_own_trace(spans: InMemorySpanExporter) -> None:
    other = "0af7651916cd43dd8448eb211c80319c"
    msgs = [FakeMsg("drawer.created", {"traceparent": TP, "Nats-Msg-Id": "drawer.created:a"}),
            FakeMsg("drawer.created", {"traceparent": f"00-{other}-b7ad6b7169203331-01",
                                       "Nats-Msg-Id": "drawer.created:b"})]
    body = DrawerCreated(event_id="b", workspace_id="w2", drawer_ids=["b" * 32]).model_dump_json().encode()
    with tracing.consuming("embed", "drawer.created", msgs):
        assert tracing.in_batch()
        decode_event(DrawerCreated, body, Settings())
        # A batch's lines cannot name one event: none is bound.
        ctx = structlog.contextvars.get_contextvars()
        assert "event_id" not in ctx and ctx["trace_id"] == TRACE and ctx["trace_ids"] == [TRACE, other]
        heads = {}
        for cause in ("a", "b"):
            heads[cause] = {}
            with tracing.publishing("drawer.embedded", heads[cause], cause=cause):
                pass
    assert _trace_of(heads["a"]) == TRACE and _trace_of(heads["b"]) == other
    assert not tracing.in_batch()


def test_failure_is_recorded_on_the_span(spans: InMemorySpanExporter) -> None:
    spans.clear()
    with tracing.consuming("classify", "drawer.embedded", [FakeMsg("drawer.embedded", {"traceparent": TP})]) as s:
        try:
            raise RuntimeError("boom")
        except RuntimeError as e:
            tracing.record_failure(s, e, "failed")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.events[0].name == "exception" and "RuntimeError" in str(span.events[0].attributes)


def test_otlp_endpoint_only_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "PALACE_OTLP_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    assert tracing.otlp_traces_endpoint(Settings()) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert tracing.otlp_traces_endpoint(Settings()) == "http://collector:4318/v1/traces"
    monkeypatch.setenv("PALACE_OTLP_ENDPOINT", "http://palace-collector:4318")
    assert tracing.otlp_traces_endpoint(Settings()) == "http://palace-collector:4318/v1/traces"


def test_trace_headers_keeps_only_the_trace(spans: Any) -> None:
    assert tracing.trace_headers({"Traceparent": TP, "Palace-reason": "x", "Nats-Msg-Id": "y"}) == {"traceparent": TP}
