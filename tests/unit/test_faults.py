"""Which failures hold a message in place (a dependency is down) and which count as its own."""

from __future__ import annotations

import httpx
import nats.errors
import psycopg
import psycopg_pool

from shared.faults import is_transient
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
