"""Which failures are the world's fault, not the message's.

A handler that fails because PostgreSQL restarts, NATS reconnects or the embedding endpoint is
down would fail the same way for every message; counting those attempts toward ``max_deliver``
would dead-letter good input during any outage longer than the backoff schedule. The pipeline
middleware instead holds such a message and retries it in place (shared.bus) until the dependency
is back; only failures that could be the message's own go through NAK, backoff and dead-lettering.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import psycopg

__all__ = ["dependency_of", "is_transient", "to_raise"]


def _optional_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    try:
        import nats.errors as ne
        import nats.js.errors as jse

        types += [ne.ConnectionClosedError, ne.TimeoutError, ne.NoServersError, ne.StaleConnectionError,
                  ne.OutboundBufferLimitError, ne.ConnectionReconnectingError, ne.FlushTimeoutError,
                  jse.NoStreamResponseError, jse.ServiceUnavailableError]
    except ImportError:  # pragma: no cover - nats is a core dependency
        pass
    try:
        import httpx

        types.append(httpx.TransportError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def _openai_types() -> tuple[type[BaseException], ...]:
    """The OpenAI client's transient errors, only once something has imported the client: no process
    without an LLM or remote embedder can raise them, and importing the package costs every service's
    start-up about as much as all of its other imports together."""
    openai = sys.modules.get("openai")
    if openai is None:
        return ()
    return (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)


_TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,  # connection lost, server shutting down, pool timeout, serialization retry
    psycopg.InterfaceError,  # "the connection is closed"
    ConnectionError,
    TimeoutError,
    asyncio.TimeoutError,
    *_optional_types(),
)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says a dependency is unreachable or overloaded."""
    seen = 0
    transient = _TRANSIENT + _openai_types()
    e: BaseException | None = exc
    while e is not None and seen < 5:
        if isinstance(e, transient):
            return True
        e = e.__cause__  # an explicit `raise ... from`, not whatever happened to be handled nearby
        seen += 1
    return False


def to_raise(errors: Sequence[BaseException]) -> BaseException:
    """Of the failures of a batch's items, the one to raise to the consumer loop: a transient one where
    there is any, else the first. The loop holds a batch that failed for a dependency and runs it again in
    place (what a former run acked is not redone, ``services._runtime.decode_batch``); any other failure
    NAKs what is left, and each NAK uses up one of a message's attempts. Raising the first failure let an
    item that failed on its own NAK a batch-mate that only met an outage."""
    return next((e for e in errors if is_transient(e)), errors[0])


def dependency_of(exc: BaseException) -> str:
    """Which dependency a transient failure is of: ``database``, ``nats``, ``endpoint`` (an embedding or
    LLM endpoint over HTTP) or ``other``. Alerts tell outages apart by it rather than by exception class
    names, which a subclass (psycopg's AdminShutdown on a failover) or a new client error would escape."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 5:
        module = type(e).__module__.split(".")[0]
        if module in ("psycopg", "psycopg_pool"):
            return "database"
        if module == "nats":
            return "nats"
        if module in ("openai", "httpx", "httpcore"):
            return "endpoint"
        e = e.__cause__
        seen += 1
    return "other"
