"""Named entities without a model (the no-LLM path): proper names, quoted titles, technology tokens.

A capital letter is the best offline signal English gives for a name, and the weakest at the
start of a sentence, where every word has one. So a sentence-initial word counts only when the
caller knows it as a name (``known``: the session's speakers and the words it capitalises
mid-sentence) or it cannot be an ordinary word (mixed case, digits, an acronym, a possessive
followed by a noun is not enough). Entity ids come from the normalised name, so every mention of
"PostgreSQL" in a workspace lands on one entity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from shared.memory.episodes import STOPWORDS
from shared.memory.kg import entity_id, normalize_name

__all__ = ["Name", "entity_id", "extract_entities", "find_names", "known_names", "normalize_name"]

_CAP_WORD = r"(?:[A-ZÀ-ÖØ-Þ][\w&'’.-]*[\w&]|[A-ZÀ-ÖØ-Þ])"
_CAP_SEQ = re.compile(rf"\b({_CAP_WORD}(?: (?:of (?:the )?|de |van |& )?{_CAP_WORD}){{0,4}})")
_QUOTED = re.compile(r"[\"“”]([A-Z0-9][^\"“”\n]{1,80}?)[\"“”]")
_TECH = re.compile(r"\b([a-z]+[A-Z][A-Za-z0-9]+|[A-Za-z]+\d+[A-Za-z0-9]*|[a-z]+(?:\.js|\.py|DB|SQL))\b")
_SENT_START = re.compile(r"(?:^|[.!?…]\s*[\"”']?\s+|\n|[-–—:]\s+|[(\[]\s*)$")
_POSSESSIVE = re.compile(r"['’]s$")
# Capitalised words that are not names wherever they stand: interjections, pronouns, calendar words.
_NOT_NAMES = frozenset("""i i'm i've i'll i'd ok okay hey hi hello thanks thank yes yeah yep no nope wow oh ooh aw
aww sure great good nice so and but the that this these those my your our it it's omg lol haha hah woah whoa
woohoo yay congrats congratulations btw anyway well cool awesome amazing love dear wait hmm um uh please sorry
monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thurs fri sat sun
january february march april june july august september october november december jan feb mar apr jun jul
aug sep sept oct nov dec today tomorrow yesterday tonight weekend christmas""".split())


@dataclass(frozen=True)
class Name:
    """A name as written in the text, its guessed type, and how sure the extractor is of it."""

    name: str
    entity_type: str
    confidence: float
    start: int


def known_names(texts: Iterable[str], speakers: Iterable[str] = ()) -> frozenset[str]:
    """Folded single words a conversation writes with a capital away from a sentence start (and
    the speakers' names): what lets "Max and I went camping" count its sentence-initial "Max"."""
    out = {normalize_name(s) for s in speakers if s}
    for text in texts:
        for m in _CAP_SEQ.finditer(text):
            if _SENT_START.search(text[: m.start()]):
                continue
            for w in m.group(1).split():
                w = _POSSESSIVE.sub("", w)
                if w.lower() not in _NOT_NAMES and w.lower() not in STOPWORDS:
                    out.add(normalize_name(w))
    return frozenset(out)


def _odd_case(word: str) -> bool:
    """Mixed case or an acronym ("LeBron", "LGBTQ", "iPhone"): no ordinary word is written so."""
    core = _POSSESSIVE.sub("", word)
    return len(core) > 1 and (core.isupper() or any(c.isupper() for c in core[1:]))


_PERSON_NEXT = re.compile(r"(?:\s+(?:and|&)\s+(?:I\b|me\b|[A-Z][a-z])|\s+(?:said|says|told|asked|thinks|thought|"
                          r"replied|wrote|texted|called)\b)")
_CONNECTORS = frozenset({"of", "the", "de", "van", "&"})


def _runs(seq: str) -> list[tuple[int, list[str]]]:
    """The capitalised run split where a word cannot be part of a name ("Last Fri I" → "Last"):
    (offset in ``seq``, words) pieces, connectors kept only inside a piece."""
    out: list[tuple[int, list[str]]] = []
    cur: list[str] = []
    cur_at = pos = 0
    for w in seq.split(" "):
        folded = normalize_name(_POSSESSIVE.sub("", w))
        if w and (folded in _NOT_NAMES or (folded in STOPWORDS and folded not in _CONNECTORS)):
            if cur:
                out.append((cur_at, cur))
            cur = []
        elif w:
            if not cur:
                if folded in _CONNECTORS:
                    pos += len(w) + 1
                    continue
                cur_at = pos
            cur.append(w)
        pos += len(w) + 1
    if cur:
        out.append((cur_at, cur))
    for i, (at, words) in enumerate(out):
        while words and normalize_name(words[-1]) in _CONNECTORS:
            words = words[:-1]
        out[i] = (at, words)
    return [(at, words) for at, words in out if words]


def find_names(text: str, speakers: Iterable[str] = (), known: frozenset[str] = frozenset()) -> list[Name]:
    """Proper names and quoted titles in ``text``, in order of appearance, one per normalised name."""
    speakers = tuple(s for s in speakers if s)
    folded_speakers = {normalize_name(s) for s in speakers}
    found: dict[str, Name] = {}

    def add(name: str, etype: str, conf: float, start: int) -> None:
        name = name.strip(" .'’-&")
        key = normalize_name(name)
        if len(key) < 2 or key in _NOT_NAMES or key in STOPWORDS:
            return
        if key not in found:
            found[key] = Name(name, etype, conf, start)

    for m in _QUOTED.finditer(text):
        add(m.group(1), "work", 0.9, m.start(1))
    quoted = [(m.start(1), m.end(1)) for m in _QUOTED.finditer(text)]
    for m in _CAP_SEQ.finditer(text):
        if any(a <= m.start() < b for a, b in quoted):
            continue
        at_start = bool(_SENT_START.search(text[: m.start()]))
        for offset, words in _runs(m.group(1)):
            start = m.start() + offset
            if at_start and offset == 0:
                # A sentence's first word is capitalised anyway: it opens a name only when known as
                # one, written oddly, followed by more capitalised words ("Grand Canyon"), or in the
                # place of a person ("Maria and Tomás decided", "Max and I", "Rob said").
                first = normalize_name(_POSSESSIVE.sub("", words[0]))
                second = normalize_name(_POSSESSIVE.sub("", words[1])) if len(words) > 1 else ""
                after = text[m.start() + offset + len(words[0]):]
                if not (first in known or _odd_case(words[0]) or _PERSON_NEXT.match(after)
                        or (len(words) > 1 and not _POSSESSIVE.search(words[0]) and second not in known)):
                    start += len(words[0]) + 1
                    words = words[1:]
            if not words:
                continue
            name = " ".join([*words[:-1], _POSSESSIVE.sub("", words[-1])])
            key = normalize_name(name)
            etype = "person" if key in folded_speakers else "concept"
            add(name, etype, 0.8 if len(words) > 1 or key in known or _odd_case(name) else 0.7, start)
    for m in _TECH.finditer(text):
        add(m.group(1), "technology", 0.6, m.start())
    return sorted(found.values(), key=lambda n: n.start)


def extract_entities(text: str, speakers: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(name, type) pairs found in ``text``; type is 'person' for known speakers, else a guess."""
    return [(n.name, n.entity_type) for n in find_names(text, speakers, known_names([], speakers))]
