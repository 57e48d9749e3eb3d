"""De-duplication decisions (pure): does a drawer say the same thing as an existing one?

Candidates come from the wording, not from a scan: ``wording_bands`` is a MinHash of the drawer's word
pairs cut into LSH bands, each band hashed *with the workspace id*, so a GIN index on the bands finds
the earlier drawers that share a band — within this workspace only, at a cost that does not grow with
it — and a near-verbatim text (the only kind ever merged) shares a band with near certainty.

Embedding neighbours only *propose* twins. An e5-family cosine of 0.97 is not "the same text", and our
embeddings carry the preceding turn as context, so two different replies in similar exchanges sit close
together: measured on locomo-dev, a cosine-only rule merged 1,315 of 2,743 distinct turns. A merge
therefore also needs the normalised contents to be near-verbatim (difflib ratio ≥ ``lexical``), and the
words that differ to carry no information of their own (``_filler_only``): "I moved to Berlin in March" and
"I moved to Munich in March" are near-verbatim by any ratio, but the second is a new fact, which a merge
would hide behind the first.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import re
from dataclasses import dataclass

import numpy as np

from shared.memory.episodes import STOPWORDS

__all__ = ["BANDS", "ROWS", "Decision", "decide", "lexical_similarity", "wording_bands"]

_WORDS = re.compile(r"\w+")
BANDS, ROWS = 16, 2  # 32 MinHash values; texts with word-pair Jaccard 0.6 share a band with p > 0.999
_rng = np.random.default_rng(0x5A1ACE)  # fixed: bands must be identical in every process, forever
_A = (_rng.integers(1, 2**63, size=BANDS * ROWS, dtype=np.uint64) | np.uint64(1)).reshape(-1, 1)
_B = _rng.integers(0, 2**63, size=BANDS * ROWS, dtype=np.uint64).reshape(-1, 1)


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def wording_bands(workspace_id: str, content: str) -> list[int]:
    """LSH band keys (signed 64-bit, for a PostgreSQL ``bigint[]``) of the content's wording.

    Words are compared as ``lexical_similarity`` sees them (case and punctuation ignored); shingles are
    word pairs (single words for a one-word text). Multiply-shift hashing gives the 32 MinHash values.
    """
    words = _WORDS.findall(content.lower())
    shingles = {f"{a} {b}" for a, b in itertools.pairwise(words)} or set(words) or {content}
    x = np.fromiter((_h64(sh) for sh in shingles), dtype=np.uint64, count=len(shingles)).reshape(1, -1)
    with np.errstate(over="ignore"):
        mins = ((_A * x + _B) >> np.uint64(32)).min(axis=1)  # arithmetic mod 2**64 is the hash family
    out = []
    for b in range(BANDS):
        key = f"{workspace_id}|{b}|{mins[b * ROWS]}|{mins[b * ROWS + 1]}"
        out.append(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True))
    return out


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


# Words whose presence or absence says nothing new ("the", "just", "so", "really"): a near-verbatim repeat may
# differ by these only. Negations are never filler (the contradiction check handles "not").
_FILLER = STOPWORDS - {"no", "nor", "not", "never", "none", "nothing", "nobody", "neither", "without"}


def _filler_only(a: str, b: str) -> bool:
    """Whether the words that differ between ``a`` and ``b`` (case and punctuation ignored) are all filler."""
    wa, wb = _WORDS.findall(a.lower()), _WORDS.findall(b.lower())
    ops = difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes()
    differ = [w for tag, i1, i2, j1, j2 in ops if tag != "equal" for w in (*wa[i1:i2], *wb[j1:j2])]
    return all(w in _FILLER for w in differ)


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
        if lex >= lexical and _filler_only(content, other):
            return Decision("MERGE", tid, sim, f"cosine {sim:.3f} >= {threshold}, wording {lex:.2f} >= {lexical}")
    return Decision("NONE", None, best, "no near-verbatim twin")
