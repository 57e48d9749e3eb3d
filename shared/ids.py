"""Deterministic identifiers and content hashing.

Every derived row's id is a pure function of its workspace and content, so a redelivered message or
a replayed session writes the same keys and upserts become no-ops: exactly-once effect on an
at-least-once bus.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

__all__ = ["content_hash", "drawer_id", "event_id_for", "normalize_content", "session_event_id", "stable_id"]

_WS = re.compile(r"\s+")


def normalize_content(text: str) -> str:
    """Canonical form used for hashing: NFC, whitespace collapsed, trimmed (case is kept)."""
    return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


def content_hash(text: str) -> str:
    """SHA-256 of the normalised content, hex."""
    return hashlib.sha256(normalize_content(text).encode("utf-8")).hexdigest()


def stable_id(*parts: str) -> str:
    """A 32-hex id from parts joined unambiguously (length-prefixed, so ('a','bc') != ('ab','c'))."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode("utf-8")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()[:32]


def drawer_id(workspace_id: str, chash: str) -> str:
    """Drawer id: workspace + content hash, so an exact repeat in a workspace is one drawer."""
    return stable_id("drawer", workspace_id, chash)


def event_id_for(kind: str, *parts: str) -> str:
    """Deterministic event id for derived events (doubles as the JetStream Nats-Msg-Id)."""
    return stable_id("event", kind, *parts)


def session_event_id(workspace_id: str, session_id: str, turns: Iterable[tuple[str, str]]) -> str:
    """Id of a ``session.completed`` published without one: workspace, session and the (role, content)
    turns, so re-publishing the same session is recognised as a repeat. The one derivation: ingest
    (through the event model) and dead-lettering both call it, so a producer finds its rejected
    event under the id Palace would have given it."""
    digest = content_hash("\x1e".join(f"{role}\x1f{content}" for role, content in turns))
    return event_id_for("session.completed", workspace_id, session_id, digest)
