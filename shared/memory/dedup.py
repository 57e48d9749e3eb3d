"""De-duplication decisions (pure): does a drawer say the same thing as an existing one?

Embedding neighbours only *propose* twins. An e5-family cosine of 0.97 is not "the same text", and our
embeddings carry the preceding turn as context, so two different replies in similar exchanges sit close
together: measured on locomo-dev, a cosine-only rule merged 1,315 of 2,743 distinct turns. A merge
therefore also needs the normalised contents to be near-verbatim (difflib ratio ≥ ``lexical``).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = ["Decision", "decide", "lexical_similarity"]

_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class Decision:
    action: str  # MERGE | NONE
    target: str | None
    similarity: float
    reason: str


def lexical_similarity(a: str, b: str) -> float:
    """Similarity of the word sequences (case and punctuation ignored), 0..1."""
    wa, wb = _WORDS.findall(a.lower()), _WORDS.findall(b.lower())
    if not wa or not wb:
        return 0.0
    return difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio()


def decide(content: str, twins: list[tuple[str, float, str]], threshold: float, lexical: float = 0.9) -> Decision:
    """MERGE into the first proposed twin that is both close in embedding space and near-verbatim.

    Args:
        content: the new drawer's text.
        twins: (drawer id, cosine, content) of older neighbours, nearest first.
        threshold: minimum cosine for a twin to be considered.
        lexical: minimum word-sequence similarity for a merge.
    """
    best = 0.0
    for tid, sim, other in twins:
        if sim < threshold:
            break
        lex = lexical_similarity(content, other)
        best = max(best, lex)
        if lex >= lexical:
            return Decision("MERGE", tid, sim, f"cosine {sim:.3f} >= {threshold}, wording {lex:.2f} >= {lexical}")
    return Decision("NONE", None, best, "no near-verbatim twin")
