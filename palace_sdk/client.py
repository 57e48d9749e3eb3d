"""``PalaceClient`` (blocking) and ``AsyncPalaceClient`` (asyncio): one workspace's memory over the
HTTP API, and producers' ``session.completed`` events over NATS.

A client is bound to one workspace, like an API key is: every call reads or writes that workspace
only. Both clients send the same requests (``palace_sdk._calls``) and return the same models
(``palace_sdk.models``); a refusal raises the ``palace_sdk.errors`` class of its status.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, TypeVar

import httpx
import nats
from pydantic import BaseModel

from palace_sdk import _calls as calls
from palace_sdk._events import DEFAULT_MAX_EVENT_BYTES, DEFAULT_STREAM, connect, encode_session, publish_encoded
from palace_sdk.errors import PalaceError
from palace_sdk.models import (
    Accepted,
    Deleted,
    Drawer,
    FactAdded,
    Facts,
    FactsEnded,
    Identity,
    Injection,
    KgStats,
    Published,
    Recall,
    SearchResult,
    WakeUp,
)
from shared.events.models import SessionCompleted

__all__ = ["AsyncPalaceClient", "PalaceClient"]

M = TypeVar("M", bound=BaseModel)
Direction = Literal["outgoing", "incoming", "both"]
Event = SessionCompleted | dict[str, Any]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _need_nats(nats_url: str | None) -> str:
    if not nats_url:
        raise PalaceError("publishing needs nats_url (the NATS server of the Palace stack)")
    return nats_url


class _Settings:
    def __init__(self, workspace: str, api_url: str, api_key: str | None, nats_url: str | None, stream: str,
                 max_event_bytes: int, timeout: float, retries: int = 2) -> None:
        self.workspace = workspace
        self.api_url = api_url.rstrip("/")
        self.api_key = api_key
        self.nats_url = nats_url
        self.stream = stream
        self.max_event_bytes = max_event_bytes
        self.timeout = timeout
        self.retries = max(0, retries)


_RETRY_WAIT_MAX_S = 10.0


def _retry_wait(response: httpx.Response) -> float | None:
    """Seconds to wait before asking again, or None when asking again cannot help. 429 (over the rate
    limit) and 503 (a dependency of the api unreachable for a moment) say when, in Retry-After; every call
    the SDK makes is safe to repeat (reads, and writes keyed by deterministic ids)."""
    if response.status_code not in (429, 503):
        return None
    try:
        advised = float(response.headers.get("retry-after", "1"))
    except ValueError:
        advised = 1.0
    return min(max(advised, 0.1), _RETRY_WAIT_MAX_S)


# ----------------------------------------------------------------------------------------- async
class AsyncKg:
    """The temporal knowledge graph of the client's workspace (``client.kg``)."""

    def __init__(self, client: AsyncPalaceClient) -> None:
        self._c = client

    async def query(self, entity: str, *, as_of: str | None = None, direction: Direction = "both",
                    limit: int = 200) -> Facts:
        """An entity's relations; with ``as_of`` (ISO 8601) only those that held then."""
        return await self._c._run(calls.kg_query(self._c.workspace, entity, as_of, direction, limit))

    async def add(self, subject: str, predicate: str, obj: str, *, valid_from: str | None = None,
                  valid_to: str | None = None, confidence: float = 1.0, source_drawer: str | None = None) -> FactAdded:
        """Record subject --predicate--> obj (entities are created when missing)."""
        return await self._c._run(calls.kg_add(self._c.workspace, subject, predicate, obj, valid_from, valid_to,
                                               confidence, source_drawer))

    async def invalidate(self, subject: str, predicate: str, obj: str, *, ended: str | None = None) -> FactsEnded:
        """End a current fact (NotFound when none holds); it stays for as-of questions."""
        return await self._c._run(calls.kg_invalidate(self._c.workspace, subject, predicate, obj, ended))

    async def timeline(self, entity: str | None = None, *, limit: int = 100) -> Facts:
        """Every fact about the entity (or all), in the order they started."""
        return await self._c._run(calls.kg_timeline(self._c.workspace, entity, limit))

    async def stats(self) -> KgStats:
        return await self._c._run(calls.kg_stats(self._c.workspace))


class AsyncPalaceClient:
    """One workspace's memory, for asyncio code. Use it as ``async with AsyncPalaceClient(...) as c``
    (or call ``aclose``): it keeps an HTTP connection pool and, once something is published, a NATS
    connection.

    Args:
        workspace: the workspace every call reads and writes.
        api_url: the Palace API, e.g. ``http://127.0.0.1:8080``.
        api_key: the workspace's API key (``palace apikey create``), needed when the API authenticates.
        nats_url: the stack's NATS server, needed only by ``publish_session``.
        retries: times a call refused with 429 or 503 is asked again, after the server's Retry-After
            (at most 10 s); then the refusal is raised (``RateLimited``, ``ServerError``).
    """

    def __init__(self, workspace: str, api_url: str = "http://127.0.0.1:8080", *, api_key: str | None = None,
                 nats_url: str | None = None, stream: str = DEFAULT_STREAM,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, timeout: float = 30.0, retries: int = 2) -> None:
        self._s = _Settings(workspace, api_url, api_key, nats_url, stream, max_event_bytes, timeout, retries)
        self._http = httpx.AsyncClient(base_url=self._s.api_url, headers=_headers(api_key), timeout=timeout)
        self._nc: nats.NATS | None = None
        self._connecting = asyncio.Lock()
        self.kg = AsyncKg(self)

    @property
    def workspace(self) -> str:
        return self._s.workspace

    async def __aenter__(self) -> AsyncPalaceClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def _run(self, call: calls.Call[M]) -> M:
        for attempt in range(self._s.retries + 1):
            response = await self._http.request(call.method, call.path, json=call.json, params=call.params)
            wait = _retry_wait(response)
            if wait is None or attempt == self._s.retries:
                break
            await asyncio.sleep(wait)
        return call.parse(response)

    async def publish_session(self, event: Event) -> Published:
        """Validate a ``session.completed`` (a model or its JSON as a dict) and publish it to JetStream,
        returning once it is stored. The event's workspace must be the client's. ``EventInvalid`` when
        it does not match the schema or is too large: nothing is sent."""
        model, data = encode_session(event, self._s.max_event_bytes)
        if model.workspace_id != self.workspace:
            raise PalaceError(f"the event is for workspace {model.workspace_id!r}; this client is bound to "
                              f"{self.workspace!r}")
        async with self._connecting:  # calls at once share one connection; a closed one is replaced
            if self._nc is None or self._nc.is_closed:
                self._nc = await connect(_need_nats(self._s.nats_url), self._s.timeout)
            nc = self._nc
        return await publish_encoded(nc, model, data, self._s.stream, self._s.timeout)

    async def search(self, query: str, k: int = 10, *, include_episodes: bool = False,
                     episodes_k: int = 3) -> SearchResult:
        """Hybrid recall (L3): the k best memories, best first, each scored 0–1, cited and explained.
        With ``include_episodes``, also the ``episodes_k`` nearest session episodes in ``.episodes``."""
        return await self._run(calls.search(self.workspace, query, k, include_episodes, episodes_k))

    async def wake_up(self, wing: str | None = None) -> WakeUp:
        """L0 identity + L1 essential story: what an agent loads when a session begins."""
        return await self._run(calls.wake_up(self.workspace, wing))

    async def recall(self, wing: str | None = None, room: str | None = None) -> Recall:
        """L2: the most important memories of a wing and/or room."""
        return await self._run(calls.recall(self.workspace, wing, room))

    async def inject(self, message: str, *, token_budget: int = 200, threshold: float | None = None) -> Injection:
        """Auto-inject: a ``<memory_context>`` block for a user message, or an empty one (see ``skipped``)."""
        return await self._run(calls.inject(self.workspace, message, token_budget, threshold))

    async def get_identity(self) -> Identity:
        """L0 (NotFound when none is set)."""
        return await self._run(calls.get_identity(self.workspace))

    async def set_identity(self, text: str) -> Identity:
        """Set L0: at most 400 characters, never truncated (InvalidRequest when longer)."""
        return await self._run(calls.set_identity(self.workspace, text))

    async def add(self, content: str, *, wing: str | None = None, room: str | None = None, hall: str | None = None,
                  agent: str | None = None) -> Accepted:
        """Store one memory verbatim (queued durably; filed within seconds under ``drawer_ids``)."""
        return await self._run(calls.add(self.workspace, content, wing, room, hall, agent))

    async def delete(self, drawer_id: str, *, reason: str | None = None) -> Deleted:
        """Forget a memory (soft delete, audited, reversible) by drawer id or citation. NotFound when no
        live drawer has the id."""
        if not calls.is_drawer_id(drawer_id):
            drawer_id = (await self.get(drawer_id)).drawer_id
        return await self._run(calls.delete(self.workspace, drawer_id, reason))

    async def get(self, ref: str) -> Drawer:
        """The drawer a citation (``wing/room/short id``, as hits, layers and inject cite it) or a drawer id
        names. NotFound when no live drawer matches, Conflict when a short id is shared (use the id)."""
        return await self._run(calls.get_drawer(self.workspace, ref))


# ----------------------------------------------------------------------------------------- sync
class Kg:
    """The temporal knowledge graph of the client's workspace (``client.kg``)."""

    def __init__(self, client: PalaceClient) -> None:
        self._c = client

    def query(self, entity: str, *, as_of: str | None = None, direction: Direction = "both",
              limit: int = 200) -> Facts:
        """An entity's relations; with ``as_of`` (ISO 8601) only those that held then."""
        return self._c._run(calls.kg_query(self._c.workspace, entity, as_of, direction, limit))

    def add(self, subject: str, predicate: str, obj: str, *, valid_from: str | None = None,
            valid_to: str | None = None, confidence: float = 1.0, source_drawer: str | None = None) -> FactAdded:
        """Record subject --predicate--> obj (entities are created when missing)."""
        return self._c._run(calls.kg_add(self._c.workspace, subject, predicate, obj, valid_from, valid_to,
                                         confidence, source_drawer))

    def invalidate(self, subject: str, predicate: str, obj: str, *, ended: str | None = None) -> FactsEnded:
        """End a current fact (NotFound when none holds); it stays for as-of questions."""
        return self._c._run(calls.kg_invalidate(self._c.workspace, subject, predicate, obj, ended))

    def timeline(self, entity: str | None = None, *, limit: int = 100) -> Facts:
        """Every fact about the entity (or all), in the order they started."""
        return self._c._run(calls.kg_timeline(self._c.workspace, entity, limit))

    def stats(self) -> KgStats:
        return self._c._run(calls.kg_stats(self._c.workspace))


class PalaceClient:
    """One workspace's memory, blocking: the same operations as ``AsyncPalaceClient``. Use it as a
    context manager (or call ``close``). ``publish_session`` runs its own event loop, so call it from
    plain (not async) code; in async code use ``AsyncPalaceClient``."""

    def __init__(self, workspace: str, api_url: str = "http://127.0.0.1:8080", *, api_key: str | None = None,
                 nats_url: str | None = None, stream: str = DEFAULT_STREAM,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, timeout: float = 30.0, retries: int = 2) -> None:
        self._s = _Settings(workspace, api_url, api_key, nats_url, stream, max_event_bytes, timeout, retries)
        self._http = httpx.Client(base_url=self._s.api_url, headers=_headers(api_key), timeout=timeout)
        self.kg = Kg(self)

    @property
    def workspace(self) -> str:
        return self._s.workspace

    def __enter__(self) -> PalaceClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, call: calls.Call[M]) -> M:
        for attempt in range(self._s.retries + 1):
            response = self._http.request(call.method, call.path, json=call.json, params=call.params)
            wait = _retry_wait(response)
            if wait is None or attempt == self._s.retries:
                break
            time.sleep(wait)
        return call.parse(response)

    def publish_session(self, event: Event) -> Published:
        """Validate a ``session.completed`` and publish it to JetStream (see AsyncPalaceClient)."""
        model, data = encode_session(event, self._s.max_event_bytes)
        if model.workspace_id != self.workspace:
            raise PalaceError(f"the event is for workspace {model.workspace_id!r}; this client is bound to "
                              f"{self.workspace!r}")
        url = _need_nats(self._s.nats_url)

        async def go() -> Published:
            nc = await connect(url, self._s.timeout)
            try:
                return await publish_encoded(nc, model, data, self._s.stream, self._s.timeout)
            finally:
                await nc.close()

        return asyncio.run(go())

    def search(self, query: str, k: int = 10, *, include_episodes: bool = False,
               episodes_k: int = 3) -> SearchResult:
        """Hybrid recall (L3): the k best memories, best first, each scored 0–1, cited and explained.
        With ``include_episodes``, also the ``episodes_k`` nearest session episodes in ``.episodes``."""
        return self._run(calls.search(self.workspace, query, k, include_episodes, episodes_k))

    def wake_up(self, wing: str | None = None) -> WakeUp:
        """L0 identity + L1 essential story: what an agent loads when a session begins."""
        return self._run(calls.wake_up(self.workspace, wing))

    def recall(self, wing: str | None = None, room: str | None = None) -> Recall:
        """L2: the most important memories of a wing and/or room."""
        return self._run(calls.recall(self.workspace, wing, room))

    def inject(self, message: str, *, token_budget: int = 200, threshold: float | None = None) -> Injection:
        """Auto-inject: a ``<memory_context>`` block for a user message, or an empty one (see ``skipped``)."""
        return self._run(calls.inject(self.workspace, message, token_budget, threshold))

    def get_identity(self) -> Identity:
        """L0 (NotFound when none is set)."""
        return self._run(calls.get_identity(self.workspace))

    def set_identity(self, text: str) -> Identity:
        """Set L0: at most 400 characters, never truncated (InvalidRequest when longer)."""
        return self._run(calls.set_identity(self.workspace, text))

    def add(self, content: str, *, wing: str | None = None, room: str | None = None, hall: str | None = None,
            agent: str | None = None) -> Accepted:
        """Store one memory verbatim (queued durably; filed within seconds under ``drawer_ids``)."""
        return self._run(calls.add(self.workspace, content, wing, room, hall, agent))

    def delete(self, drawer_id: str, *, reason: str | None = None) -> Deleted:
        """Forget a memory (soft delete, audited, reversible) by drawer id or citation. NotFound when no
        live drawer has the id."""
        if not calls.is_drawer_id(drawer_id):
            drawer_id = self.get(drawer_id).drawer_id
        return self._run(calls.delete(self.workspace, drawer_id, reason))

    def get(self, ref: str) -> Drawer:
        """The drawer a citation (``wing/room/short id``, as hits, layers and inject cite it) or a drawer id
        names. NotFound when no live drawer matches, Conflict when a short id is shared (use the id)."""
        return self._run(calls.get_drawer(self.workspace, ref))
