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
