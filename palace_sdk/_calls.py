"""Every API operation described once, without I/O: the request to send and the model of the answer.

``PalaceClient`` and ``AsyncPalaceClient`` only differ in how they send a ``Call``; what is sent and how
the answer is read lives here, so the two can never drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from palace_sdk.errors import error_for
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
    Recall,
    SearchResult,
    WakeUp,
)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Call(Generic[M]):
    method: str
    path: str
    model: type[M]
    json: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def parse(self, response: httpx.Response) -> M:
        if response.status_code >= 400:
            raise error_for(response)
        return self.model.model_validate(response.json())


_DRAWER_ID = re.compile(r"[0-9a-f]{32}")


def is_drawer_id(ref: str) -> bool:
    """A whole drawer id (anything else, such as a citation, is resolved through ``get_drawer`` first)."""
    return _DRAWER_ID.fullmatch(ref) is not None


def _ws(workspace: str) -> str:
    return f"/v1/workspaces/{quote(workspace, safe='')}"


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def search(ws: str, query: str, k: int, include_episodes: bool = False, episodes_k: int = 3) -> Call[SearchResult]:
    body: dict[str, Any] = {"workspace_id": ws, "query": query, "k": k}
    if include_episodes:  # the request stays what it was without them
        body.update(include_episodes=True, episodes_k=episodes_k)
    return Call("POST", "/v1/search", SearchResult, body)


def wake_up(ws: str, wing: str | None) -> Call[WakeUp]:
    return Call("POST", "/v1/wake_up", WakeUp, _clean({"workspace_id": ws, "wing": wing}))


def recall(ws: str, wing: str | None, room: str | None) -> Call[Recall]:
    return Call("POST", "/v1/recall", Recall, _clean({"workspace_id": ws, "wing": wing, "room": room}))


def inject(ws: str, message: str, token_budget: int, threshold: float | None) -> Call[Injection]:
    return Call("POST", "/v1/inject", Injection, _clean({"workspace_id": ws, "message": message,
                                                         "token_budget": token_budget, "threshold": threshold}))


def get_identity(ws: str) -> Call[Identity]:
    return Call("GET", f"{_ws(ws)}/identity", Identity)


def set_identity(ws: str, text: str) -> Call[Identity]:
    return Call("PUT", f"{_ws(ws)}/identity", Identity, {"text": text})


def add(ws: str, content: str, wing: str | None, room: str | None, hall: str | None,
        agent: str | None) -> Call[Accepted]:
    return Call("POST", f"{_ws(ws)}/drawers", Accepted,
                _clean({"content": content, "wing": wing, "room": room, "hall": hall, "agent": agent}))


def delete(ws: str, drawer_id: str, reason: str | None) -> Call[Deleted]:
    return Call("DELETE", f"{_ws(ws)}/drawers/{quote(drawer_id, safe='')}", Deleted, None,
                _clean({"reason": reason}))


def get_drawer(ws: str, ref: str) -> Call[Drawer]:
    return Call("GET", f"{_ws(ws)}/palace/citations/{quote(ref.strip(), safe='/')}", Drawer)


def kg_query(ws: str, entity: str, as_of: str | None, direction: str, limit: int) -> Call[Facts]:
    return Call("GET", f"{_ws(ws)}/kg/facts", Facts, None,
                _clean({"entity": entity, "as_of": as_of, "direction": direction, "limit": limit}))


def kg_timeline(ws: str, entity: str | None, limit: int) -> Call[Facts]:
    return Call("GET", f"{_ws(ws)}/kg/timeline", Facts, None, _clean({"entity": entity, "limit": limit}))


def kg_stats(ws: str) -> Call[KgStats]:
    return Call("GET", f"{_ws(ws)}/kg/stats", KgStats)


def kg_add(ws: str, subject: str, predicate: str, obj: str, valid_from: str | None, valid_to: str | None,
           confidence: float, source_drawer: str | None) -> Call[FactAdded]:
    return Call("POST", f"{_ws(ws)}/kg/facts", FactAdded, _clean({
        "subject": subject, "predicate": predicate, "object": obj, "valid_from": valid_from, "valid_to": valid_to,
        "confidence": confidence, "source_drawer": source_drawer}))


def kg_invalidate(ws: str, subject: str, predicate: str, obj: str, ended: str | None) -> Call[FactsEnded]:
    return Call("POST", f"{_ws(ws)}/kg/facts/invalidate", FactsEnded,
                _clean({"subject": subject, "predicate": predicate, "object": obj, "ended": ended}))
