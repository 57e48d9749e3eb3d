"""Auto-inject (GoClaw): relevant memories for a user message, as a block put before the agent's turn.

A message with fewer than ``MIN_MEANINGFUL_WORDS`` meaningful words ("ok thanks!", "yes", "go on")
injects nothing: recalling on it would put noise into every short turn. Otherwise the message is
searched (L3) and the hits at or above ``threshold`` on the 0–1 relevance scale go, best first, into a
``<memory_context>…</memory_context>`` block of at most ``token_budget`` tokens; nothing is injected
when no hit is relevant enough.

Tokens are counted with ``approx_tokens``, a documented approximation rather than the embedder's
tokenizer: the block is read by the agent's LLM, whose tokenizer Palace does not know, and the
approximation errs on the high side for English and for code (one token per 4 characters, or per
word or punctuation mark when that is more), and for Chinese, Japanese and Korean text (one token per
character of those scripts, which have no spaces between words).

The block is data, not instructions: a memory holds whatever was said, ``</memory_context>`` and a
forged instruction after it included, so ``<``, ``>`` and ``&`` in a memory or its citation are
written as XML entities and nothing stored can end the block early. Only the hits shown count as
recalled (their access time and count, which ranking and pruning read), not the near-misses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from shared.db.search import SearchHit
from shared.memory.citations import snippet
from shared.memory.episodes import STOPWORDS
from shared.recall import Recaller

__all__ = ["DEFAULT_TOKEN_BUDGET", "MIN_MEANINGFUL_WORDS", "MIN_TOKEN_BUDGET", "Injection", "approx_tokens", "as_data",
           "build_block", "inject", "meaningful_words"]

DEFAULT_TOKEN_BUDGET = 200
# The empty block and one citation take about 17 tokens and a hit is cut no shorter than 12: a smaller
# budget could never inject anything.
MIN_TOKEN_BUDGET = 32
MIN_MEANINGFUL_WORDS = 3
SEARCH_K = 10
OPEN, CLOSE = "<memory_context>", "</memory_context>"

# Han, Hiragana, Katakana and Hangul: scripts written without spaces, where \w+ would take a whole
# sentence for one word. Each of their characters is a word (and about a token) of its own here.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}](?:[^\W{_CJK}]|['’-])*", re.UNICODE)
_PIECE = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]", re.UNICODE)
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def meaningful_words(message: str) -> list[str]:
    """The message's words that carry meaning: lower-cased, stopwords and one-letter words left out
    (numbers count: "2024" names a year; so does each character of a script written without spaces)."""
    out = []
    for w in _WORD.findall(message.lower()):
        w = w.strip("'’-")
        if (len(w) > 1 or w.isdigit() or re.fullmatch(f"[{_CJK}]", w)) and w not in STOPWORDS:
            out.append(w)
    return out


def approx_tokens(text: str) -> int:
    """Tokens an LLM tokenizer is likely to need for ``text``, rounded up (see the module docstring)."""
    return max(math.ceil(len(text) / 4), len(_PIECE.findall(text)))


def as_data(text: str) -> str:
    """``text`` with ``&``, ``<`` and ``>`` as XML entities: inside the block, never markup."""
    return text.translate(_ESCAPES)


@dataclass(frozen=True)
class Injection:
    """What auto-inject decided for one message.

    ``block`` is empty when nothing is injected; ``skipped`` then says why ("trivial": too few
    meaningful words, "no_match": no hit at or above the threshold, "budget": not even one hit fits).
    ``match_count`` counts hits at or above the threshold, ``injected_count`` those in the block,
    ``top_score`` is the best hit's relevance (0 when there was no hit), ``threshold`` the one applied."""

    block: str
    tokens: int
    match_count: int
    injected_count: int
    top_score: float
    skipped: str | None = None
    citations: list[str] = field(default_factory=list)
    threshold: float = 0.0


def build_block(hits: list[SearchHit], token_budget: int) -> tuple[str, list[SearchHit]]:
    """The ``<memory_context>`` block of as many of ``hits`` (in order) as fit ``token_budget``; a hit
    that fits only in part is cut (ending "…") when at least 12 tokens of it fit. Returns ("", []) when
    not even one fits."""
    lines: list[str] = []
    shown: list[SearchHit] = []

    def block(extra: list[str]) -> str:
        return "\n".join([OPEN, *lines, *extra, CLOSE])

    for h in hits:
        cite = as_data(h.citation)
        line = f"- [{cite}] {as_data(snippet(h.content, 2_000))}"
        if approx_tokens(block([line])) <= token_budget:
            lines.append(line)
            shown.append(h)
            continue
        left = token_budget - approx_tokens(block([f"- [{cite}] "]))
        if left >= 12:  # shrink the content until the block fits (the count is not linear in length)
            chars = left * 4
            while chars > 0:
                line = f"- [{cite}] {as_data(snippet(h.content, chars))}"
                if approx_tokens(block([line])) <= token_budget:
                    lines.append(line)
                    shown.append(h)
                    break
                chars -= max(4, chars // 10)
        break
    return (block([]), shown) if shown else ("", [])


async def inject(
    recaller: Recaller, workspace_id: str, message: str, *, token_budget: int = DEFAULT_TOKEN_BUDGET,
    threshold: float | None = None,
) -> Injection:
    """Memories relevant to ``message`` as a block within ``token_budget`` tokens, or nothing.

    Args:
        recaller: the search path (pool, embedder, query cache) of the process.
        workspace_id: the only workspace read.
        message: the user's message, verbatim.
        token_budget: most tokens the block may hold, tags included (``approx_tokens``).
        threshold: least 0–1 relevance a hit needs to be injected (default: the recaller's,
            PALACE_INJECT_THRESHOLD). The scale orders every hit of a workspace, related or not, so a
            threshold is what tells a memory worth the agent's context from the best of unrelated ones.
    """
    if threshold is None:
        threshold = recaller.inject_threshold
    if token_budget < 1:
        raise ValueError("token_budget must be positive")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError("threshold is on the 0–1 relevance scale")
    if len(meaningful_words(message)) < MIN_MEANINGFUL_WORDS:
        return Injection("", 0, 0, 0, 0.0, "trivial", threshold=threshold)
    hits = await recaller.search(workspace_id, message, SEARCH_K, touch=False)
    top = hits[0].score if hits else 0.0
    relevant = [h for h in hits if h.score >= threshold]
    if not relevant:
        return Injection("", 0, 0, 0, top, "no_match", threshold=threshold)
    text, shown = build_block(relevant, token_budget)
    recaller.note_access(workspace_id, [h.id for h in shown])
    if not shown:
        return Injection("", 0, len(relevant), 0, top, "budget", threshold=threshold)
    return Injection(text, approx_tokens(text), len(relevant), len(shown), top, None, [h.citation for h in shown],
                     threshold)
