"""The SDK without servers: it imports no service code, maps every error status to its exception with
the server's reason, and refuses an invalid or oversized event before anything is sent."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from palace_sdk import (
    BadRequest,
    Conflict,
    EventInvalid,
    Forbidden,
    InvalidRequest,
    NotFound,
    PalaceAPIError,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
)
from palace_sdk._events import encode_session
from palace_sdk.errors import error_for


def test_imports_only_the_event_models() -> None:
    code = ("import sys, palace_sdk; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('services', 'shared', 'fastapi', 'psycopg', 'faststream', 'mcp')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # The event models and the import-free modules they read their bounds from (limits, moments).
    assert eval(out) == ["shared", "shared.events", "shared.events.models", "shared.ids", "shared.limits",
                         "shared.moments"]


@pytest.mark.parametrize(("status", "cls"), [
    (400, BadRequest), (401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict),
    (413, PayloadTooLarge), (422, InvalidRequest), (429, RateLimited), (500, ServerError), (503, ServerError),
    (418, PalaceAPIError),
])
def test_each_status_has_its_exception(status: int, cls: type[PalaceAPIError]) -> None:
    err = error_for(httpx.Response(status, json={"detail": f"reason {status}"}))
    assert type(err) is cls and err.status == status and err.detail == f"reason {status}"
    assert f"reason {status}" in str(err)


def test_error_code_and_retry_after_come_from_the_server() -> None:
    r = httpx.Response(429, json={"error": "rate_limited", "detail": "slow down"}, headers={"Retry-After": "3"})
    err = error_for(r)
    assert isinstance(err, RateLimited) and err.code == "rate_limited" and err.retry_after == 3.0
    fields = [{"loc": ["body", "k"], "msg": "Input should be less than or equal to 50"}]
    invalid = error_for(httpx.Response(422, json={"error": "invalid_request", "detail": fields}))
    assert isinstance(invalid, ValueError) and invalid.detail == fields
    plain = error_for(httpx.Response(502, text="bad gateway"))
    assert isinstance(plain, ServerError) and plain.detail == "bad gateway"


def test_events_are_validated_before_sending() -> None:
    ok = {"workspace_id": "acme", "session_id": "s1", "messages": [{"role": "user", "content": "hello there"}]}
    model, data = encode_session(ok, 10_000)
    assert model.event_id and b'"event_id"' in data
    with pytest.raises(EventInvalid, match="role"):
        encode_session({**ok, "messages": [{"role": "bot", "content": "hi"}]}, 10_000)
    with pytest.raises(EventInvalid, match="extra"):
        encode_session({**ok, "surprise": 1}, 10_000)
    with pytest.raises(EventInvalid, match="at most 500"):
        encode_session({**ok, "messages": [{"role": "user", "content": "x" * 600}]}, 500)


def test_publishing_to_an_unreachable_nats_fails_fast_with_a_palace_error() -> None:
    """nats-py's defaults tried for about two minutes, printing a traceback each time, then raised its own
    error: a producer learns within its timeout, as a PalaceError it can catch."""
    import time

    from palace_sdk import NatsUnreachable, PalaceClient, PalaceError

    client = PalaceClient("w", nats_url="nats://127.0.0.1:1", timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(NatsUnreachable, match="no NATS server") as e:
        client.publish_session({"workspace_id": "w", "session_id": "s",
                                "messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(e.value, PalaceError) and time.monotonic() - t0 < 5


@pytest.mark.parametrize("status", [429, 503])
def test_a_refusal_that_says_when_to_ask_again_is_asked_again(status: int) -> None:
    """429 and 503 come with Retry-After ("may work in a moment"); the SDK raised them at once."""
    from palace_sdk import PalaceClient

    answers = [httpx.Response(status, json={"detail": "busy"}, headers={"Retry-After": "0.1"}),
               httpx.Response(200, json={"workspace_id": "w", "query": "q", "hits": []})]
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return answers[min(len(asked), len(answers)) - 1]

    client = PalaceClient("w", "http://palace.test")
    client._http = httpx.Client(base_url="http://palace.test", transport=httpx.MockTransport(handler))
    assert client.search("q").hits == [] and len(asked) == 2
    # Past its retries the refusal is raised; one that asking again cannot fix is raised at once.
    answers[1] = answers[0]
    asked.clear()
    with pytest.raises(RateLimited if status == 429 else ServerError):
        client.search("q")
    assert len(asked) == 3
    answers[0] = httpx.Response(422, json={"detail": "bad"})
    asked.clear()
    with pytest.raises(InvalidRequest):
        client.search("q")
    assert len(asked) == 1
