"""Episode summaries: extractive (no LLM), and the LLM's when one is configured (its prompt and the
strict reading of its answer; the call itself is the enrich service's, outside any transaction). The
L0 abstract is always extractive."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from shared.memory.classify import classify
from shared.memory.llm_labels import LlmParseError, outer_json_object, strip_wrappers

__all__ = ["STOPWORDS", "SUMMARY_MAX_CHARS", "EpisodeDraft", "episode_embedding", "parse_summary",
           "summarize_session", "summary_messages", "top_keywords"]

SUMMARY_MAX_CHARS = 1200
_PROMPT_TURN_CHARS = 600
_PROMPT_CHARS = 24_000  # a long session is summarised from its most important turns, in order
_SUMMARY_SYSTEM = (
    "You summarise a conversation for an assistant's long-term memory. Answer with JSON only: "
    '{"summary": "..."}. At most five sentences in the third person, naming the speakers; keep decisions, '
    "preferences, facts about people, plans and dates; leave out greetings and small talk; invent nothing."
)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we were
what when where which while who whom why will with would you your yours yourself yourselves also get got
really like know think going yeah yes okay oh well im i'm it's that's don't didn't can't one would could
thing things lot much something anything everything way make made want wanted good great nice thanks thank
hey hi""".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{2,}")


@dataclass(frozen=True)
class EpisodeDraft:
    summary: str
    abstract: str
    topics: list[str]


def top_keywords(texts: list[str], n: int = 8) -> list[str]:
    """Most frequent content words (lower-cased, stopwords removed)."""
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(w.lower() for w in _WORD.findall(t) if w.lower() not in STOPWORDS)
    return [w for w, _ in counts.most_common(n)]


def summarize_session(
    turns: list[tuple[str | None, str]], max_sentences: int = 4, max_chars: int = 1200
) -> EpisodeDraft:
    """Pick the most important turns (heuristic importance), keep their order, prefix the speaker.

    Args:
        turns: (speaker, content) in conversation order; noise already removed.
        max_sentences: turns kept in the summary.
        max_chars: hard cap of the summary.
    """
    if not turns:
        return EpisodeDraft("", "", [])
    # Every turn is kept when there are no more than max_sentences: their importance would decide nothing
    # (the kept turns stay in conversation order), so it is not computed.
    keep = (range(len(turns)) if len(turns) <= max_sentences else
            sorted(range(len(turns)), key=lambda i: (-classify(turns[i][1]).importance, i))[:max_sentences])
    parts = []
    for i in sorted(keep):
        who, text = turns[i]
        snippet = text if len(text) <= 300 else text[:297].rsplit(" ", 1)[0] + "…"
        parts.append(f"{who}: {snippet}" if who else snippet)
    summary = " ".join(parts)[:max_chars]
    first = parts[0]
    abstract = first if len(first) <= 200 else first[:199].rsplit(" ", 1)[0] + "…"
    return EpisodeDraft(summary, abstract, top_keywords([t for _, t in turns]))


def episode_embedding(vectors: list[np.ndarray]) -> np.ndarray | None:
    """The unit-length mean of the session's drawer vectors (None when none is embedded): the
    episode lands where its turns are in the embedding space, so a question near any of them finds it."""
    if not vectors:
        return None
    m = np.mean(np.asarray(vectors, dtype=np.float32), axis=0)
    n = float(np.linalg.norm(m))
    return (m / n if n else m).astype(np.float32)


def summary_messages(turns: list[tuple[str | None, str]]) -> list[dict[str, str]]:
    """Chat messages asking for the session's summary. A session longer than the prompt budget is
    represented by its most important turns (the extractive summary's ranking), kept in order."""
    order = sorted(range(len(turns)), key=lambda i: (-classify(turns[i][1]).importance, i))
    keep, used = set(), 0
    for i in order:
        n = min(len(turns[i][1]), _PROMPT_TURN_CHARS)
        if used + n > _PROMPT_CHARS and keep:
            break
        keep.add(i)
        used += n
    payload = {"session": [{"speaker": who or "unknown", "text": text[:_PROMPT_TURN_CHARS]}
                           for i, (who, text) in enumerate(turns) if i in keep]}
    return [{"role": "system", "content": _SUMMARY_SYSTEM},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}]


def parse_summary(text: str) -> str:
    """The summary in the model's answer (reasoning blocks and fences stripped, whitespace collapsed,
    cut at a word to ``SUMMARY_MAX_CHARS``).

    Raises:
        LlmParseError: no JSON object with a non-empty "summary" string.
    """
    data = outer_json_object(strip_wrappers(text))
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, str) or not summary.strip():
        raise LlmParseError(f"no summary in the answer: {text[:120]!r}")
    summary = " ".join(summary.split())
    if len(summary) > SUMMARY_MAX_CHARS:
        summary = summary[:SUMMARY_MAX_CHARS - 1].rsplit(" ", 1)[0] + "…"
    return summary
