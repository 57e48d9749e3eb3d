"""Entity dedup: when are two entities the same one? (pure decision logic; SQL in shared.db.entity_dedup)

Peers lost records to false merges, so the rules here ask for evidence that names alone cannot fake
and treat an embedding as corroboration only, never as a reason:

* ``same_name``: the names are one name written two ways (accents, case, punctuation, spacing, a
  possessive: "Tomás"/"Tomas", "Node.js"/"NodeJS", "Mel's"/"Mel") and the types do not conflict.
* ``alias``: one entity is already known by the other's name (an alias an operator or an earlier
  merge recorded), and that name belongs to no third entity.
* ``short_name``: a person called by part of their name ("Caroline" / "Caroline Smith"), only when
  exactly one longer name fits and the two share a relation (same predicate, same counterpart).
  Things are not merged this way: "Lisbon" and "Lisbon office", "PostgreSQL" and "PostgreSQL 16"
  are different things.

Everything else that looks alike (a different spelling, "Caroline" / "Carolina"; a type conflict,
"Mel" the person / "Mel's" the diner; a short name that fits several people; a short name without a
shared relation) is at most *flagged* for an operator, and only when something besides the name
backs the suspicion (a shared relation, close context embeddings, or the exact same name).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Literal

from shared.memory.episodes import STOPWORDS

__all__ = [
    "BLOCK_CHARS",
    "SPELLING_SIMILARITY",
    "Candidate",
    "Decision",
    "canonical_name",
    "decide_pair",
    "dedup_keys",
    "extends",
    "name_similarity",
    "name_words",
    "type_family",
    "types_conflict",
    "worth_checking",
]

BLOCK_CHARS = 4  # names that share their first letters are compared by spelling ("caro": Caroline, Carolina)
SPELLING_SIMILARITY = 0.75  # from here two different names are spelled alike (flagged with other evidence)

_POSSESSIVE = re.compile(r"['’]s\b")
_ARTICLE = re.compile(r"^the\s+")

# Type labels of extractors (pattern, LLM, NER) grouped into families. Types in one family, or an
# unspecific one, are compatible; two specific families conflict ("Mel" the person, "Mel's" the place).
_FAMILIES: dict[str, str] = {}
for _fam, _labels in {
    "person": "person people human user speaker per character name",
    "place": "place location loc gpe city country region venue restaurant building address fac facility",
    "organization": "organization organisation org company team group institution norp",
    "technology": "technology tech tool software product framework language database library service system",
    "event": "event meeting holiday",
    "time": "date time period",
    "animal": "animal pet",
    "work": "work_of_art book film movie song artwork",
}.items():
    for _label in _labels.split():
        _FAMILIES[_label] = _fam
UNSPECIFIC = frozenset({"", "unknown", "concept", "thing", "other", "misc", "entity", "topic"})


# Symbols that tell names apart: "C++", "C#" and "C" are three languages, "AT&T" is not "ATT".
_NAME_SYMBOLS = frozenset("+#&")


def canonical_name(name: str) -> str:
    """A name reduced to what identifies it: accents, case, punctuation, spacing, a possessive and a
    leading "the" removed, but not the symbols some names are made of (``_NAME_SYMBOLS``). Two names
    with the same canonical form are one name written two ways."""
    s = unicodedata.normalize("NFKD", name).casefold()
    s = "".join(c for c in s if not unicodedata.combining(c))
    s = _ARTICLE.sub("", _POSSESSIVE.sub("", s.strip()))
    return "".join(c for c in s if c.isalnum() or c in _NAME_SYMBOLS)


def name_words(name: str) -> list[str]:
    """The name's words in canonical form (accents, case and possessives removed), in order."""
    s = unicodedata.normalize("NFKD", name).casefold()
    s = "".join(c for c in s if not unicodedata.combining(c))
    s = _POSSESSIVE.sub("", s)
    return [w for w in ("".join(c for c in part if c.isalnum()) for part in s.split()) if w]


def dedup_keys(name: str) -> list[str]:
    """The index keys an entity is found by when another entity is checked against it:

    ``n:`` its canonical name (same_name, and the short-name lookup of a longer name's words),
    ``w:`` each content word of a name of several words (a short name finds the longer ones),
    ``b:`` the first letters of its canonical name (spelling variants are compared, never merged).
    """
    canon = canonical_name(name)
    if not canon:
        return []
    keys = [f"n:{canon}", f"b:{canon[:BLOCK_CHARS]}"]
    words = name_words(name)
    if len(words) > 1:
        keys += [f"w:{w}" for w in dict.fromkeys(words) if w not in STOPWORDS and len(w) > 1]
    return keys


def type_family(entity_type: str | None) -> str | None:
    """The family of a type label; None for an unspecific one (compatible with any)."""
    t = (entity_type or "").strip().casefold().replace(" ", "_")
    if t in UNSPECIFIC:
        return None
    return _FAMILIES.get(t, t)


def types_conflict(a: str | None, b: str | None) -> bool:
    fa, fb = type_family(a), type_family(b)
    return fa is not None and fb is not None and fa != fb


def name_similarity(a: str, b: str) -> float:
    """Spelling similarity of two canonical names, 0..1."""
    return SequenceMatcher(None, canonical_name(a), canonical_name(b)).ratio()


def extends(short: list[str], long_: list[str]) -> bool:
    """``long_`` is ``short`` with words added before or after ("Caroline" → "Caroline Smith")."""
    n = len(short)
    return 0 < n < len(long_) and (long_[:n] == short or long_[-n:] == short)


def worth_checking(a: str, b: str, *, alias: bool = False) -> bool:
    """Whether any rule could merge or flag the pair on the names alone; the evidence (relations,
    contexts) is only gathered for those, so a common first name costs a comparison, not queries."""
    if alias or canonical_name(a) == canonical_name(b):
        return True
    wa, wb = name_words(a), name_words(b)
    return extends(wa, wb) or extends(wb, wa) or name_similarity(a, b) >= SPELLING_SIMILARITY


@dataclass(frozen=True)
class Candidate:
    """An entity checked against another, with the evidence gathered about the pair."""

    id: str
    name: str
    entity_type: str
    mention_count: int
    shared_relations: int = 0           # same predicate to the same counterpart, same direction
    context_similarity: float | None = None  # cosine of the mean embeddings of the drawers mentioning each
    alias_of_other: bool = False        # this entity is known by the other's name (or the other by its)
    alias_owners: int = 1               # how many live entities go by that name
    longer_names: int = 0               # for a short name: how many live entities' names extend it


@dataclass(frozen=True)
class Decision:
    """What to do with a pair: merge (``loser`` into ``survivor``), flag for an operator, or nothing."""

    action: Literal["merge", "flag", "none"]
    rule: str
    reason: str
    survivor: str | None = None
    loser: str | None = None
    score: float = 0.0
    evidence: dict[str, object] = field(default_factory=dict)


def _survivor(a: Candidate, b: Candidate) -> tuple[Candidate, Candidate]:
    """The entity the pair is kept as: the better-known one (more mentions), then the smaller id, so
    replicas deciding the same pair independently pick the same survivor."""
    first, second = sorted((a, b), key=lambda c: (-c.mention_count, c.id))
    return first, second


def decide_pair(
    a: Candidate, b: Candidate, *, context_threshold: float, kept_apart: bool = False
) -> Decision:
    """Decide whether ``a`` and ``b`` are one entity.

    ``a`` is the entity that was just upserted, ``b`` a candidate found through the name indexes.
    ``kept_apart``: an operator (or a revert) said these two are different: never merged again.
    """
    ev: dict[str, object] = {
        "names": [a.name, b.name], "types": [a.entity_type, b.entity_type],
        "shared_relations": max(a.shared_relations, b.shared_relations),
        "context_similarity": None if a.context_similarity is None else round(a.context_similarity, 4),
    }
    shared = max(a.shared_relations, b.shared_relations)
    ctx = a.context_similarity if a.context_similarity is not None else b.context_similarity
    close_context = ctx is not None and ctx >= context_threshold
    corroborated = shared > 0 or close_context
    conflict = types_conflict(a.entity_type, b.entity_type)
    ca, cb = canonical_name(a.name), canonical_name(b.name)
    if not ca or not cb:
        return Decision("none", "none", "a name without letters or digits")
    same = ca == cb

    def flag(rule: str, reason: str, score: float) -> Decision:
        return Decision("flag", rule, reason, score=round(score, 4), evidence=ev)

    if kept_apart:
        return Decision("none", "kept_apart", "an operator kept these apart", evidence=ev)
    if conflict:
        if same or ((a.alias_of_other or b.alias_of_other) and corroborated):
            return flag("type_conflict", f"same name but {a.entity_type!r} vs {b.entity_type!r}", 0.5)
        return Decision("none", "type_conflict", "different kinds of thing", evidence=ev)
    if same:
        s, lo = _survivor(a, b)
        return Decision("merge", "same_name", f"{lo.name!r} is {s.name!r} written another way",
                        survivor=s.id, loser=lo.id, score=1.0, evidence=ev)
    if a.alias_of_other or b.alias_of_other:
        if max(a.alias_owners, b.alias_owners) == 1:
            # The entity that carries the other's name as an alias is the one the name was given to.
            s, lo = (b, a) if b.alias_of_other else (a, b)
            return Decision("merge", "alias", f"{s.name!r} is also known as {lo.name!r}",
                            survivor=s.id, loser=lo.id, score=1.0, evidence=ev)
        return flag("alias", "the name is an alias of several entities", 0.6)
    wa, wb = name_words(a.name), name_words(b.name)
    short, long_ = (a, b) if len(wa) < len(wb) else (b, a)
    ws, wl = (wa, wb) if short is a else (wb, wa)
    contained = extends(ws, wl)
    if contained:
        person = "person" in (type_family(short.entity_type), type_family(long_.entity_type))
        unique = max(a.longer_names, b.longer_names) <= 1
        if person and unique and shared > 0:
            return Decision("merge", "short_name", f"{short.name!r} is how {long_.name!r} is called for short",
                            survivor=long_.id, loser=short.id, score=0.9, evidence=ev)
        if corroborated:
            why = ("several people have that name" if person and not unique
                   else "no shared relation" if person else "a part of a thing's name may be another thing")
            return flag("short_name", f"{short.name!r} may be {long_.name!r}: {why}", 0.7 if shared else 0.6)
        return Decision("none", "short_name", "part of the name only, nothing else in common", evidence=ev)
    sim = name_similarity(a.name, b.name)
    if sim >= SPELLING_SIMILARITY and corroborated:
        return flag("spelling", f"{a.name!r} and {b.name!r} are spelled alike ({sim:.2f}): different names "
                    "are never merged automatically", sim)
    return Decision("none", "different", "different names", evidence=ev)
