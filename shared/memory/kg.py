"""Temporal knowledge graph: names, predicates, time arguments and the result types (pure).

This module is the one place where an entity's name becomes a key. ``normalize_name`` feeds the
entity id (``entity_id``), so "PostgreSQL", " postgresql " and "ＰｏｓｔｇｒｅＳＱＬ" are one entity
in a workspace; ``match_key`` and ``text_words`` turn names and running text into the same word
sequences, so the inline linker finds a name in a drawer exactly when the name's words occur there.

A fact (triple) holds from ``valid_from`` through ``valid_to`` (both included, as MemPalace reads
its dates: a fact ended "2025-01-14" was still true that day). ``valid_from`` is when
the fact was said (the message's time), never when Palace processed it; ``valid_to`` is set once,
by an invalidation, and a fact is never overwritten or deleted, so an "as of" question about a
time before the invalidation still gets the old answer.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.ids import stable_id
from shared.memory.episodes import STOPWORDS
from shared.moments import time_problem

__all__ = [
    "KG_MIN_IMPORTANCE",
    "MAX_NAME_CHARS",
    "MAX_PREDICATE_CHARS",
    "Direction",
    "Fact",
    "KgError",
    "KgStats",
    "Sighting",
    "TextWords",
    "TripleAdded",
    "anchor_word",
    "as_of_window",
    "entity_id",
    "match_key",
    "normalize_name",
    "normalize_predicate",
    "parse_direction",
    "parse_when",
    "pick_links",
    "text_words",
    "triple_id",
    "validate_name",
]

MAX_NAME_CHARS = 200
# A processed drawer at least this important gets its entities and facts extracted even when its
# session's extraction never read it (issue 14, point 2: the sweep over migration 0042's queue).
KG_MIN_IMPORTANCE = 3.0
MAX_PREDICATE_CHARS = 100

Direction = Literal["outgoing", "incoming", "both"]
_DIRECTIONS: dict[str, Direction] = {
    "outgoing": "outgoing", "out": "outgoing", "incoming": "incoming", "in": "incoming", "both": "both",
}


class KgError(ValueError):
    """Bad input to a knowledge-graph operation: a clear message for the caller, never a crash."""


# --- names ---------------------------------------------------------------------------------------


def normalize_name(name: str) -> str:
    """Canonical form of an entity name: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def entity_id(workspace_id: str, name: str) -> str:
    """Entity id: workspace + normalised name, so every spelling variant lands on one row."""
    return stable_id("entity", workspace_id, normalize_name(name))


def validate_name(name: str, what: str = "entity name") -> str:
    """The name stripped; ``KgError`` when it is empty, too long or holds control characters."""
    if not isinstance(name, str):
        raise KgError(f"{what} must be a string")
    clean = " ".join(unicodedata.normalize("NFC", name).split())
    if not clean:
        raise KgError(f"{what} is empty")
    if len(clean) > MAX_NAME_CHARS:
        raise KgError(f"{what} is longer than {MAX_NAME_CHARS} characters")
    if any(unicodedata.category(c) == "Cc" for c in clean):
        raise KgError(f"{what} contains control characters")
    return clean


def normalize_predicate(predicate: str) -> str:
    """Relation names compare by words: "Works At", "works-at" and "works_at" are ``works_at``."""
    if not isinstance(predicate, str):
        raise KgError("predicate must be a string")
    words = re.findall(r"[^\W_]+", unicodedata.normalize("NFKC", predicate).casefold())
    if not words:
        raise KgError("predicate is empty")
    out = "_".join(words)
    if len(out) > MAX_PREDICATE_CHARS:
        raise KgError(f"predicate is longer than {MAX_PREDICATE_CHARS} characters")
    return out


def triple_id(workspace_id: str, subject_id: str, predicate: str, object_id: str, valid_from: datetime) -> str:
    """A fact's id: the same statement said at the same time is one row however often it is replayed."""
    return stable_id("triple", workspace_id, subject_id, predicate, object_id,
                     valid_from.astimezone(UTC).isoformat())


# --- words, for the linker -----------------------------------------------------------------------

# A word may carry inner punctuation ("node.js", "at&t", "c++", "o'brien"); a possessive "'s" and
# trailing dots or dashes are not part of it.
_TOKEN = re.compile(r"[^\W_](?:[\w&+#.'’-]*[\w+#])?")
_POSSESSIVE = re.compile(r"['’]s$")


def _tokens(text: str) -> list[tuple[str, bool]]:
    """(folded word, written with a capital) pairs of ``text``, in order."""
    out = []
    for m in _TOKEN.finditer(unicodedata.normalize("NFKC", text)):
        word = _POSSESSIVE.sub("", m.group(0))
        if word:
            out.append((word.casefold(), any(c.isupper() for c in word)))
    return out


def match_key(name: str) -> str:
    """The words of a name, folded and space-joined: how the linker looks for it in running text."""
    return " ".join(w for w, _ in _tokens(name))


def anchor_word(key: str) -> str:
    """The word a name is looked up by: the longest of its ``match_key`` words (the first of equals).

    A name can only occur in a text that contains its anchor, so the linker probes the index with
    the text's distinct words, not with every run of words. The longest word is rarely a stopword,
    and it is computable in SQL too (migration 0009 keys the existing names that way).
    """
    return max(key.split(" "), key=len) if key else ""


@dataclass(frozen=True)
class TextWords:
    """A text as the linker reads it: its words in order (padded, space-joined, so a name is a
    substring match on word boundaries), and which words were ever written with a capital."""

    joined: str
    capitalised: frozenset[str]
    words: frozenset[str]


def text_words(text: str) -> TextWords:
    toks = _tokens(text)
    return TextWords(" " + " ".join(w for w, _ in toks) + " ", frozenset(w for w, c in toks if c),
                     frozenset(w for w, _ in toks))


def pick_links(text: TextWords, aliases: list[tuple[str, str, bool]]) -> set[str]:
    """Entity ids whose name or alias occurs in ``text`` as whole words.

    ``aliases``: (alias_key, entity_id, cased) rows. A one-word name written with a capital links
    only where the text writes it with one too ("Max" the dog, not "at max speed"); a name of
    nothing but stopwords or single letters (a pattern extractor's "What's", "So I'm") links nowhere.
    """
    out = set()
    for key, eid, cased in aliases:
        if all(w in STOPWORDS or len(w) < 2 for w in key.split(" ")):
            continue
        if " " in key:
            if f" {key} " in text.joined:
                out.add(eid)
        elif key in (text.capitalised if cased else text.words):
            out.add(eid)
    return out


# --- time ----------------------------------------------------------------------------------------


def parse_when(value: datetime | date | str | None, what: str = "time", *, stored: bool = True) -> datetime | None:
    """A point in time from a datetime, a date (its midnight, UTC) or an ISO 8601 string; naive
    datetimes are read as UTC. ``KgError`` for anything else, and for a time to be ``stored`` that the
    database could not read back (shared.moments); a bound of a question (as of) may be any."""
    if value is None:
        return None
    if isinstance(value, str):
        s = value.strip()
        try:
            value = date.fromisoformat(s) if len(s) == 10 else datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise KgError(f"{what} {value!r} is not an ISO 8601 date or time") from None
    if isinstance(value, datetime):
        out = value if value.tzinfo else value.replace(tzinfo=UTC)
    elif isinstance(value, date):
        out = datetime.combine(value, time.min, tzinfo=UTC)
    else:
        raise KgError(f"{what} must be a date, a datetime or an ISO 8601 string")
    if stored and (problem := time_problem(out)):
        raise KgError(f"{what} {problem}")
    return out


def as_of_window(value: datetime | date | str | None) -> tuple[datetime, datetime] | None:
    """The instant range an "as of" question asks about: a time is that instant; a date is the
    whole day (UTC), so a fact that started or ended during that day counts as true on it.

    A fact holds in the window when ``valid_from <= hi`` and (``valid_to`` is open or ``>= lo``).
    """
    if value is None:
        return None
    whole_day = (isinstance(value, date) and not isinstance(value, datetime)) or (
        isinstance(value, str) and len(value.strip()) == 10)
    lo = parse_when(value, "as_of", stored=False)
    assert lo is not None
    if not whole_day:
        return lo, lo
    if lo.date() == date.max:  # the day after the last one datetime can hold does not exist
        return lo, datetime.max.replace(tzinfo=lo.tzinfo)
    return lo, lo + timedelta(days=1) - timedelta(microseconds=1)


def parse_direction(direction: str) -> Direction:
    """'outgoing' / 'incoming' / 'both' (also 'out' / 'in'), case-insensitive."""
    d = _DIRECTIONS.get(str(direction).strip().lower())
    if d is None:
        raise KgError(f"direction must be one of outgoing, incoming, both (got {direction!r})")
    return d


# --- what an extractor read --------------------------------------------------------------------


@dataclass(frozen=True)
class Sighting:
    """What an extractor (the patterns or an LLM) read in one drawer: the entities written in it
    (name, type, confidence) and the facts it states (subject, predicate, object, confidence), with
    when and where it was said: ``said_at`` becomes the facts' valid_from."""

    drawer_id: str
    said_at: datetime | None
    session_id: str | None
    seq: int | None
    entities: tuple[tuple[str, str, float], ...] = ()
    triples: tuple[tuple[str, str, str, float], ...] = ()


# --- results -------------------------------------------------------------------------------------


class Fact(BaseModel):
    """One temporal triple, with its entities' display names and its provenance."""

    model_config = ConfigDict(frozen=True)

    id: str
    subject: str = Field(description="Subject's display name.")
    subject_id: str
    predicate: str
    object: str = Field(description="Object's display name.")
    object_id: str
    valid_from: datetime | None = Field(description="When the fact was said to start holding.")
    valid_to: datetime | None = Field(description="When it stopped holding; None while it still does.")
    current: bool = Field(description="True while the fact holds now.")
    direction: Literal["outgoing", "incoming"] | None = Field(
        None, description="Relative to the entity asked about: the entity is the subject (outgoing) or the object.")
    confidence: float
    source_drawer: str | None = None
    source_episode: str | None = None
    source_session: str | None = None
    source_seq: int | None = Field(None, description="The message (its position in source_session).")
    created_at: datetime = Field(description="When Palace recorded the fact.")
    invalidated_at: datetime | None = Field(None, description="When Palace recorded its end.")


class TripleAdded(BaseModel):
    """What ``add_triple`` did: the fact as stored, and whether the call created it and its entities."""

    model_config = ConfigDict(frozen=True)

    fact: Fact
    created: bool = Field(description="False when the same fact already held at valid_from (nothing written).")
    subject_created: bool
    object_created: bool


class KgStats(BaseModel):
    """Size of a workspace's graph."""

    model_config = ConfigDict(frozen=True)

    entities: int
    triples: int
    current_facts: int
    expired_facts: int
    mentions: int
    relationship_types: dict[str, int] = Field(description="Predicate → triples, most used first.")
