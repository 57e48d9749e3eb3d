"""ASGI middleware of the API: request metrics, rate limit, body limit.

Written as plain ASGI callables rather than ``BaseHTTPMiddleware`` so that they see the body as it
streams in (a chunked upload has no Content-Length to check up front) and add no task per request.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.deps import AUTHENTICATED, bearer_token
from services.api.errors import error_response
from shared import metrics
from shared.config import Settings
from shared.ratelimit import TokenBuckets
from shared.security import hash_key, is_loopback_host, key_id_of

__all__ = ["BodyLimit", "BodyTooLarge", "LoopbackHostOnly", "RateLimit", "RequestMetrics", "route_template"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope, root_path: str = "") -> str:
    """The matched route's template (``/v1/workspaces/{workspace_id}/stats``), prefixed by any mount it
    sits under; ``unmatched`` when no route matched. Never the raw path: metric labels stay bounded."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return "unmatched"
    prefix = str(scope.get("root_path", ""))[len(root_path):]
    if isinstance(route, Mount):  # an app mounted as a whole: its own paths are not ours to enumerate
        return f"{prefix or path}/*"
    return prefix + path


class RequestMetrics:
    """``palace_http_requests_total{method,route,status}`` and ``palace_http_request_seconds``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        root_path = str(scope.get("root_path", ""))
        status = 500  # what the server answers when the app raises before responding

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            method = scope["method"] if scope["method"] in _METHODS else "OTHER"
            route = route_template(scope, root_path)
            metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()
            metrics.HTTP_REQUEST_SECONDS.labels(method, route).observe(time.perf_counter() - start)


class RateLimit:
    """A token bucket per caller: the presented API key when authentication is on (a hash of it, so
    the key never sits in memory longer than the request), the client address otherwise.

    Under authentication a request without a well-formed key is not counted: it gets its 401 without
    any database work, and counting it per address would let one keyless client behind a shared
    address (an ingress, a NAT) use up the allowance of every keyed client behind it. A well-formed key
    that turns out unknown or revoked costs a key lookup, and each new one would get a fresh bucket: so
    such 401s are counted per client address as well, in a bucket of their own, and an address that has
    used it up gets 429 for any key not seen to authenticate before, without a lookup (rotating made-up
    keys no longer escape the limit; a client whose key worked goes on). Health and metrics endpoints
    are never limited: a probe must not fail because a client is busy."""

    def __init__(self, app: ASGIApp, settings: Settings, exempt: Iterable[str] = ()) -> None:
        self.app = app
        self.auth = settings.api_auth
        self.rate, self.burst = settings.api_rate_per_s, settings.api_rate_burst
        self.exempt = frozenset(exempt)
        self.buckets = (TokenBuckets(self.rate, self.burst, settings.api_rate_buckets_max)
                        if self.rate > 0 else None)
        self.failures = (TokenBuckets(self.rate, self.burst, settings.api_rate_buckets_max)
                         if self.rate > 0 else None)
        # Keys (their buckets' names) seen to authenticate lately; bounded like the buckets.
        self.known: OrderedDict[str, None] = OrderedDict()
        self.known_max = settings.api_rate_buckets_max

    def caller(self, scope: Scope) -> str | None:
        """The bucket of this request, or None when it is not limited."""
        if self.auth:
            token = bearer_token(Headers(scope=scope).get("authorization"))
            return "key:" + hash_key(token) if token is not None and key_id_of(token) is not None else None
        client = scope.get("client")
        return "addr:" + (str(client[0]) if client else "unknown")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.auth and scope["type"] == "http" and sum(k == b"authorization" for k, _ in scope["headers"]) > 1:
            # Which of two keys counts would be the reader's choice: this limiter read the first, MCP the last.
            await error_response(400, "send one Authorization header")(scope, receive, send)
            return
        caller = None
        if self.buckets is not None and scope["type"] == "http" and scope["path"] not in self.exempt:
            caller = self.caller(scope)
        if caller is None:
            await self.app(scope, receive, send)
            return
        assert self.buckets is not None and self.failures is not None
        client = scope.get("client")
        address = "failed:" + (str(client[0]) if client else "unknown")
        if self.auth and caller not in self.known and (wait := self.failures.wait(address)) > 0:
            await self._refuse(scope, receive, send, wait, "unrecognised API keys from this client address")
            return
        wait = self.buckets.take(caller)
        if wait > 0:
            await self._refuse(scope, receive, send, wait, "API key" if self.auth else "client address")
            return
        if not self.auth:
            await self.app(scope, receive, send)
            return
        status = 0
        state = scope.setdefault("state", {})  # copies of the scope downstream share this dict

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, send_status)
        if status == 401:
            self.failures.take(address)
        elif state.get(AUTHENTICATED):
            self.known[caller] = None
            self.known.move_to_end(caller)
            if len(self.known) > self.known_max:
                self.known.popitem(last=False)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, wait: float, per: str) -> None:
        response = error_response(
            429, f"rate limit exceeded: {self.rate:g} requests/s per {per}, bursts of {self.burst:g}; "
            f"retry in {wait:.2f} s", headers={"Retry-After": TokenBuckets.retry_after_header(wait)})
        await response(scope, receive, send)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once the body passes the limit. An ``HTTPException``, so FastAPI's body
    parsing lets it through as a 413 instead of turning it into a generic 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


class BodyLimit:
    """Refuse bodies over ``limit`` bytes: at once when Content-Length says so, otherwise by counting
    the bytes as they arrive, which is the only check a chunked upload allows."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.limit:
            await error_response(413, BodyTooLarge(self.limit).detail)(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as e:
            # Reached here only when no exception handler answered (e.g. an app mounted as a whole).
            if started:
                raise
            await error_response(413, e.detail)(scope, receive, send)


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8080`` → ``::1``, ``localhost:8080`` → ``localhost``."""
    h = host_header.strip()
    if h.startswith("["):
        return h[1:].split("]", 1)[0]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class LoopbackHostOnly:
    """With authentication off the api listens on loopback only (shared.security.unsafe_bind_reason), and
    yet a web page can reach it: a site that re-points its own name at 127.0.0.1 (DNS rebinding) makes
    same-origin requests, with a key-less api to answer them (a forget of everything included). Those
    requests name that site in their Host header; only loopback names (localhost, 127.0.0.1, ::1) are
    served. Used only where the api is open: with keys, or an operator-vouched open bind, any name is."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host", "")
            if not is_loopback_host(host_name(host)):
                await error_response(400, f"Host {host[:100]!r} is not this machine: without authentication the api "
                                     "answers only requests to localhost, 127.0.0.1 or [::1]")(scope, receive, send)
                return
        await self.app(scope, receive, send)
