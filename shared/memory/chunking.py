"""Chunking of long content at sentence boundaries with overlap.

Drawers stay verbatim: chunks are exact substrings of the message, never rewritten, so every chunk
can be traced back to its offset in the raw message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Chunk", "chunk_text", "split_sentences"]

_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+|\n{2,}|\n(?=\s*[-*•\d]+[.)]?\s)")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A verbatim slice ``text == source[start:end]``."""

    index: int
    start: int
    end: int
    text: str


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Sentence spans (start, end) covering ``text`` without gaps."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _SENTENCE_END.finditer(text):
        if m.end() > pos:
            spans.append((pos, m.end()))
            pos = m.end()
    if pos < len(text):
        spans.append((pos, len(text)))
    return spans


def _hard_split(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, end)) for s in range(start, end, size)]


def chunk_text(text: str, max_chars: int = 800, overlap: int = 100) -> list[Chunk]:
    """Split ``text`` into chunks of at most ``max_chars``, cut at sentence boundaries.

    Consecutive chunks share about ``overlap`` characters: the next chunk starts at the first
    sentence boundary inside the last ``overlap`` characters of the previous one (or exactly
    ``overlap`` characters back when no boundary is there), so a fact split across a boundary
    still appears whole in one chunk.

    Args:
        text: the content; returned as one chunk when it is short enough.
        max_chars: upper bound of a chunk's length.
        overlap: characters repeated between consecutive chunks; must be < max_chars / 2.
    """
    if max_chars <= 0 or overlap < 0 or overlap * 2 >= max_chars:
        raise ValueError("need max_chars > 0 and 0 <= overlap < max_chars / 2")
    if len(text) <= max_chars:
        return [Chunk(0, 0, len(text), text)] if text.strip() else []
    pieces: list[tuple[int, int]] = []
    for s, e in split_sentences(text):
        pieces.extend(_hard_split(s, e, max_chars - overlap) if e - s > max_chars - overlap else [(s, e)])
    boundaries = sorted({s for s, _ in pieces})
    chunks: list[Chunk] = []
    start = 0
    i = 0
    while start < len(text):
        end = start
        while i < len(pieces) and pieces[i][1] - start <= max_chars:
            end = pieces[i][1]
            i += 1
        if end == start:  # cannot happen after _hard_split, but never loop forever
            end = min(start + max_chars, len(text))
        body = text[start:end]
        if body.strip():
            chunks.append(Chunk(len(chunks), start, end, body))
        if end >= len(text):
            break
        # Overlap: back up to a sentence start within the last `overlap` chars, else exactly `overlap`.
        window = [b for b in boundaries if end - overlap <= b < end and b > start]
        new_start = window[0] if window else max(end - overlap, start + 1)
        # Re-align the piece cursor to the new start.
        i = next((k for k, (s, _) in enumerate(pieces) if s >= new_start), len(pieces))
        if not window:
            pieces.insert(i, (new_start, min(pieces[i][0], len(text)) if i < len(pieces) else len(text)))
        start = new_start
    return chunks
