"""Traces for the HTTP API: a plain ASGI middleware (no instrumentation package, whose per-``send``
spans the API does not need) that continues the caller's W3C trace from its ``traceparent`` header,
or starts one, around each request. A session the request publishes carries that trace on the bus,
and the request's log lines carry ``service``, ``trace_id`` and ``span_id``.

It also installs the process's tracer provider at ASGI startup (``lifespan``), so creating an app
(as tests do) changes nothing global.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from shared.config import Settings
from shared.tracing import extract, setup_tracing, trace_log_fields

__all__ = ["TraceMiddleware"]

_TRACER = trace.get_tracer("palace.api")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TraceMiddleware:
    """``app.add_middleware(TraceMiddleware, settings=settings)``: a SERVER span per HTTP request."""

    def __init__(self, app: ASGIApp, settings: Settings, service: str = "api") -> None:
        self.app = app
        self.settings = settings
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            setup_tracing(self.settings, self.service)
            structlog.contextvars.bind_contextvars(service=self.service)
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
        method = scope.get("method", "HTTP")
        status: dict[str, int] = {}

        async def send_status(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        with _TRACER.start_as_current_span(
            method, context=extract(headers), kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope.get("path", "")},
        ) as span, structlog.contextvars.bound_contextvars(service=self.service, **trace_log_fields()):
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                if "code" in status:
                    span.set_attribute("http.response.status_code", status["code"])
                    if status["code"] >= 500:
                        span.set_status(Status(StatusCode.ERROR))
