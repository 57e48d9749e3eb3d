"""De-duplication decisions (pure): what to do with a drawer given its nearest twin."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Decision", "decide"]


@dataclass(frozen=True)
class Decision:
    action: str  # MERGE | NONE
    target: str | None
    similarity: float
    reason: str


def decide(twin: tuple[str, float] | None, threshold: float) -> Decision:
    """MERGE into the twin when cosine similarity reaches ``threshold``; otherwise keep (NONE).

    Args:
        twin: (drawer id, cosine) of the nearest other drawer, or None.
        threshold: similarity from which two drawers say the same thing.
    """
    if twin is None:
        return Decision("NONE", None, 0.0, "no other drawer")
    tid, sim = twin
    if sim >= threshold:
        return Decision("MERGE", tid, sim, f"cosine {sim:.3f} >= {threshold}")
    return Decision("NONE", None, sim, f"cosine {sim:.3f} < {threshold}")
