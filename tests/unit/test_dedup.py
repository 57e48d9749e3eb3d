"""Wording bands: every near-verbatim pair the merge rule would accept shares a band (so the index finds
it), bands never match across workspaces, and unrelated texts rarely share one."""

from __future__ import annotations

import functools
import random
from pathlib import Path

from palace_dev.evaluation.locomo import load_locomo
from shared.memory.dedup import BANDS, lexical_similarity, wording_bands

LOCOMO_DEV = Path(__file__).resolve().parents[3] / "shared" / "bench" / "locomo-dev.json"


@functools.cache
def locomo_turn_texts() -> list[str]:
    return [t["text"] for c in load_locomo(LOCOMO_DEV) for s in c.sessions for t in s["turns"] if t.get("text")]


def _variant(text: str, rng: random.Random) -> str:
    """A near-verbatim rewrite: case, punctuation and one word changed."""
    words = text.split()
    i = rng.randrange(len(words))
    words[i] = "something"
    out = " ".join(words)
    return out.upper() if rng.random() < 0.3 else out.rstrip(".!?") + " !"


def test_every_near_verbatim_pair_shares_a_band() -> None:
    rng = random.Random(7)
    texts = [t for t in locomo_turn_texts() if len(t.split()) >= 10][:500]
    checked = 0
    for t in texts:
        v = _variant(t, rng)
        if lexical_similarity(t, v) < 0.9:
            continue
        checked += 1
        assert set(wording_bands("w", t)) & set(wording_bands("w", v)), (t, v)
    assert checked > 300


def test_bands_are_per_workspace_and_stable() -> None:
    text = "We decided to build the Orion backend on PostgreSQL."
    a, b = wording_bands("alpha", text), wording_bands("beta", text)
    assert len(a) == BANDS and not set(a) & set(b)
    assert a == wording_bands("alpha", text)
    assert all(-(2**63) <= x < 2**63 for x in a)


def test_unrelated_texts_rarely_share_a_band() -> None:
    texts = locomo_turn_texts()[:400]
    bands = [set(wording_bands("w", t)) for t in texts]
    pairs = shared = 0
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if lexical_similarity(texts[i], texts[j]) < 0.5:
                pairs += 1
                shared += bool(bands[i] & bands[j])
    assert shared / pairs < 0.01, f"{shared} of {pairs} unrelated pairs share a band"
