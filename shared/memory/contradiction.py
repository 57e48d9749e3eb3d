"""Does a newer drawer contradict an older one? (pure; the lexical detector and the LLM's prompt)

Candidates come from the embedding band just below near-duplicates: close enough to be about the
same thing, not so close that they say the same thing. Embedding closeness alone cannot tell "dark
mode is enabled" from "dark mode is disabled", so the lexical detector asks for substantial shared
wording plus a polarity flip: a negation on one side only that negates something the other side says
("we no longer use Postgres" against "we use Postgres"), or an antonym pair across the two.

Why the negation must reach a word of the other side: conversation is full of negations that deny
nothing said before ("can't wait", "no worries", "don't give up", "haven't talked in a while"). Counted
anywhere, they made pleasantries supersede each other: every one of the 25 supersessions of a LoCoMo-dev
pipeline run was of that kind, and a superseded drawer keeps half its score in recall.

Only a speaker's own statement is superseded (``same_voice``): when two named people disagree ("I love
hiking" / "I don't love hiking"), each statement is a fact about its speaker, and the older one is no
less true. Nine of those 25 pleasantries were across speakers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from shared.memory.llm_labels import LlmParseError, outer_json_object, strip_wrappers

__all__ = ["Verdict", "build_messages", "lexical_contradiction", "parse_verdict", "same_voice"]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NEGATIONS = frozenset({
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot", "stopped",
    "don't", "doesn't", "didn't", "isn't", "aren't", "wasn't", "weren't", "won't", "can't", "couldn't",
    "shouldn't", "wouldn't", "haven't", "hasn't", "hadn't", "longer",  # "no longer"
})
_ANTONYMS = (
    ("enabled", "disabled"), ("enable", "disable"), ("allow", "deny"), ("allowed", "denied"), ("allows", "denies"),
    ("on", "off"), ("true", "false"), ("start", "stop"), ("started", "stopped"), ("accept", "reject"),
    ("accepted", "rejected"), ("include", "exclude"), ("included", "excluded"), ("increase", "decrease"),
    ("like", "dislike"), ("likes", "dislikes"), ("love", "hate"), ("loves", "hates"), ("always", "never"),
    ("open", "closed"), ("add", "remove"), ("added", "removed"), ("win", "lose"), ("won", "lost"),
    ("pass", "fail"), ("passed", "failed"), ("public", "private"), ("required", "optional"),
    ("available", "unavailable"), ("active", "inactive"), ("valid", "invalid"), ("approved", "rejected"),
)
_ANTONYM_WORDS = frozenset(w for pair in _ANTONYMS for w in pair)
# Words between a negation and what it negates ("not really like", "never even used").
_ADVERBS = frozenset({"really", "even", "ever", "actually", "yet", "quite", "very", "too", "anymore", "much"})
_STOP = frozenset({
    "the", "a", "an", "and", "or", "but", "is", "are", "was", "were", "be", "been", "to", "of", "in", "for",
    "with", "at", "by", "it", "its", "this", "that", "we", "i", "you", "he", "she", "they", "our", "my",
    "your", "their", "as", "so", "now", "do", "does", "did", "have", "has", "had", "will", "would", "should",
    "can", "could", "from", "about", "there", "here", "just", "also", "then", "than",
})


@dataclass(frozen=True)
class Verdict:
    contradicts: bool
    reason: str


def same_voice(older: str | None, newer: str | None) -> bool:
    """Whether a newer statement may supersede (or be merged into) an older one by who said them: the same
    speaker, or a speaker unknown on either side (a message without a name is compared as before)."""
    if not older or not newer:
        return True
    return " ".join(older.split()).casefold() == " ".join(newer.split()).casefold()


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def lexical_contradiction(older: str, newer: str, *, min_shared: int = 2, min_overlap: float = 0.6) -> Verdict:
    """A contradiction when the two share most of their content words and their polarity differs."""
    wa, wb = _words(older), _words(newer)
    skip = _STOP | _NEGATIONS | _ANTONYM_WORDS
    ca, cb = {w for w in wa if w not in skip}, {w for w in wb if w not in skip}
    shared = ca & cb
    if len(shared) < min_shared or not ca or not cb or len(shared) / min(len(ca), len(cb)) < min_overlap:
        return Verdict(False, "too little shared wording")
    na, nb = _negated(wa), _negated(wb)
    sa, sb = set(wa), set(wb)
    denied = (na & sb) if na and not nb else (nb & sa) if nb and not na else set()
    if denied:  # a negation on one side only, of something the other side says
        return Verdict(True, f"negation of {', '.join(sorted(denied)[:3])} on one side only; "
                             f"shared: {', '.join(sorted(shared)[:6])}")
    for x, y in _ANTONYMS:
        if (x in sa and y in sb and y not in sa and x not in sb) or (y in sa and x in sb and x not in sa
                                                                      and y not in sb):
            return Verdict(True, f"antonyms {x}/{y}; shared: {', '.join(sorted(shared)[:6])}")
    return Verdict(False, "same polarity")


def _is_negation(w: str) -> bool:
    return w in _NEGATIONS or w.endswith("n't")


def _negated(words: list[str]) -> set[str]:
    """The word each negation applies to: the first one after it that is not a stop word, another
    negation or an adverb ("no longer use" → use, "isn't really enabled" → enabled)."""
    out = set()
    for i, w in enumerate(words):
        if not _is_negation(w):
            continue
        for x in words[i + 1 : i + 4]:
            if not (_is_negation(x) or x in _STOP or x in _ADVERBS):
                out.add(x)
                break
    return out


_SYSTEM = (
    "Two memories of the same agent, an older and a newer one. Does the newer one contradict the older one "
    "(so that the older one is no longer true)? Answer with JSON only: {\"contradicts\": true|false, "
    "\"reason\": \"one line\"}."
)


def build_messages(older: str, newer: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": _SYSTEM},
            {"role": "user", "content": json.dumps({"older": older, "newer": newer}, ensure_ascii=False)}]


def parse_verdict(text: str) -> Verdict:
    """The LLM's verdict. Raises LlmParseError when there is none (the caller falls back to lexical)."""
    body = strip_wrappers(text)
    data = outer_json_object(body)
    if not isinstance(data, dict) or not isinstance(data.get("contradicts"), bool):
        raise LlmParseError(f"no verdict in answer: {body[:120]!r}")
    reason = data.get("reason") if isinstance(data.get("reason"), str) else ""
    return Verdict(data["contradicts"], ("llm: " + reason.strip())[:300])
