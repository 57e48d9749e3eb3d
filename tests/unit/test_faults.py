"""Which failures hold a message in place (a dependency is down) and which count as its own."""

from __future__ import annotations

import httpx
import nats.errors
import psycopg
import psycopg_pool

from shared.faults import dependency_of, is_transient, to_raise
from shared.ports import EmbeddingError


def test_outages_are_transient() -> None:
    assert is_transient(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert is_transient(psycopg_pool.PoolTimeout("couldn't get a connection after 60 sec"))
    assert is_transient(nats.errors.ConnectionClosedError())
    assert is_transient(httpx.ConnectError("refused"))
    assert is_transient(ConnectionRefusedError())
    wrapped = RuntimeError("embedding failed")
    wrapped.__cause__ = httpx.ReadTimeout("slow")
    assert is_transient(wrapped)


def test_bad_data_is_not_transient() -> None:
    assert not is_transient(EmbeddingError("endpoint returned 3 embeddings for 4 inputs"))
    assert not is_transient(ValueError("NaN in embedding"))
    assert not is_transient(psycopg.errors.UniqueViolation("duplicate key"))
    handled_nearby = ValueError("bad")
    handled_nearby.__context__ = ConnectionError()
    assert not is_transient(handled_nearby), "only an explicit cause counts"


def test_openai_outages_are_transient_once_the_client_is_loaded() -> None:
    import openai

    req = httpx.Request("POST", "http://llm.invalid/v1/chat/completions")
    assert is_transient(openai.APIConnectionError(request=req))
    assert is_transient(openai.RateLimitError("slow down", response=httpx.Response(429, request=req), body=None))
    assert not is_transient(openai.BadRequestError("bad", response=httpx.Response(400, request=req), body=None))


def test_a_service_starts_without_importing_the_openai_client() -> None:
    """The client is the heaviest import there is; only a process configured for an LLM or a remote
    embedder needs it."""
    import subprocess
    import sys

    code = "import sys, services.ingest.app, services.classify.app; print('openai' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_a_batch_raises_its_transient_failure_over_one_of_its_own() -> None:
    """The loop holds a batch that raises an outage and NAKs one that raises anything else: an item that
    failed on its own must not make a batch-mate that only met an outage spend an attempt."""
    own, outage = ValueError("bad text"), psycopg.OperationalError("server closed the connection")
    assert to_raise([own, outage]) is outage
    assert to_raise([outage, own]) is outage
    second = KeyError("x")
    assert to_raise([own, second]) is own


def test_a_batch_retried_in_place_leaves_out_what_a_former_run_settled() -> None:
    """The loop runs a batch again while a dependency is down. A message the first run settled (its
    dead letter published and acked, or its work done and acked) is not decoded, dead-lettered or acked
    again: nats-py refuses a second ack with an error that is not an outage, which used to fail the retry
    and NAK the good messages."""
    import asyncio

    from nats.errors import MsgAlreadyAckdError

    from services._runtime import Deps, decode_batch
    from shared.config import Settings
    from shared.events import SessionStored

    class Raw:
        def __init__(self, data: bytes, acked: bool) -> None:
            self.data, self._ackd, self.acks = data, acked, 0

        async def ack(self) -> None:
            if self._ackd:
                raise MsgAlreadyAckdError(self)
            self._ackd, self.acks = True, self.acks + 1

    good = SessionStored(event_id="e1", workspace_id="w", session_id="s", message_count=1, drawer_ids=["d"])
    bodies = [b"{not json", good.model_dump_json().encode(), good.model_dump_json().encode()]
    raws = [Raw(bodies[0], acked=True), Raw(bodies[1], acked=True), Raw(bodies[2], acked=False)]
    # broker None: a dead letter attempted here would fail the call.
    deps = Deps(settings=Settings(), service="enrich", pool=None, broker=None)  # type: ignore[arg-type]
    events = asyncio.run(decode_batch(deps, SessionStored, bodies, raws))  # type: ignore[arg-type]
    assert [raw for _, raw in events] == [raws[2]]
    assert [r.acks for r in raws] == [0, 0, 0]


def test_a_publish_after_costly_work_is_held_through_an_outage_not_redone() -> None:
    """After a model's answer is committed, the event is published again in place while NATS is away
    (the handler is not run again, so the model is not asked again); an error of the event's own is not
    retried."""
    import asyncio

    from nats.errors import ConnectionReconnectingError

    from shared.bus import publish_held
    from shared.config import Settings
    from shared.events import SessionStored

    class Broker:
        def __init__(self, failures: list[BaseException]) -> None:
            self.failures, self.sent = failures, 0

        async def publish(self, data: bytes, **kw: object) -> None:
            if self.failures:
                raise self.failures.pop(0)
            self.sent += 1

    ev = SessionStored(event_id="e1", workspace_id="w", session_id="s", message_count=1, drawer_ids=["d"])
    s = Settings(dependency_retry_max_s=0.05)
    outage = Broker([ConnectionReconnectingError(), ConnectionReconnectingError()])
    asyncio.run(publish_held(outage, s, ev))  # type: ignore[arg-type]
    assert outage.sent == 1 and not outage.failures
    own = Broker([ValueError("bad"), ConnectionReconnectingError()])
    try:
        asyncio.run(publish_held(own, s, ev))  # type: ignore[arg-type]
        raise AssertionError("not raised")
    except ValueError:
        pass
    assert own.sent == 0 and len(own.failures) == 1


def test_each_outage_names_its_dependency_whatever_the_exception_class() -> None:
    """The alerts tell outages apart by this label: class names missed subclasses (psycopg's AdminShutdown,
    raised on a failover) and nats-py's TimeoutError."""
    assert dependency_of(psycopg.errors.AdminShutdown("terminating connection")) == "database"
    assert dependency_of(psycopg_pool.PoolTimeout("no connection in 5 s")) == "database"
    assert dependency_of(nats.errors.TimeoutError()) == "nats"
    assert dependency_of(httpx.ConnectError("refused")) == "endpoint"
    wrapped = EmbeddingError("the embedding endpoint failed")
    wrapped.__cause__ = httpx.ReadTimeout("slow")
    assert dependency_of(wrapped) == "endpoint"
    assert dependency_of(ConnectionResetError()) == "other"
