"""A tiny OTLP/HTTP trace receiver in the test process: the services of the test stack export their
spans to it (``PALACE_OTLP_ENDPOINT``), so a test sees what a collector would receive. It accepts
``POST /v1/traces`` (protobuf, optionally gzip), decodes it with the official opentelemetry-proto
messages and keeps the spans in memory."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "ReceivedSpan"]


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str


class OtlpReceiver:
    def __init__(self, max_spans: int = 200_000) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._max = max_spans
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="otlp-receiver")

    @property
    def endpoint(self) -> str:
        """The base URL (``PALACE_OTLP_ENDPOINT``); the exporter posts to ``<it>/v1/traces``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, req: ExportTraceServiceRequest) -> None:
        got: list[ReceivedSpan] = []
        for rs in req.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(attrs.get("service.name", ""), s.name, s.kind, s.trace_id.hex(),
                                            s.span_id.hex(), s.parent_span_id.hex()))
        with self._lock:
            self.requests += 1
            self.spans.extend(got[: max(0, self._max - len(self.spans))])

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
