"""Which classification phase decides a drawer: heuristic, centroid, or the LLM's cold path.

The heuristic is trusted from ``high`` up. In the middle band (``low`` to ``high``) the nearest
type centroid decides when it is close enough. Everything else is the LLM's; with no LLM
configured the heuristic label stands, so a store without an LLM still processes every drawer.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.memory.classify import Classification

__all__ = ["Decision", "decide"]


@dataclass(frozen=True, slots=True)
class Decision:
    memory_type: str
    confidence: float
    importance: float
    tier: str  # heuristic | centroid | llm (llm: not decided yet, goes to the cold path)


def decide(
    c: Classification, *, low: float, high: float, centroid_hit: tuple[str, float] | None, llm_enabled: bool
) -> Decision:
    """Route one heuristic outcome.

    Args:
        c: the heuristic classification.
        low, high: the middle confidence band.
        centroid_hit: the nearest centroid's (type, cosine) when it cleared its gate, else None.
        llm_enabled: whether an LLM endpoint is configured.
    """
    if c.confidence >= high:
        return Decision(c.memory_type, c.confidence, c.importance, "heuristic")
    if c.confidence >= low and centroid_hit is not None:
        t, cos = centroid_hit
        return Decision(t, round(cos, 3), c.importance, "centroid")
    if llm_enabled:
        return Decision(c.memory_type, c.confidence, c.importance, "llm")
    return Decision(c.memory_type, c.confidence, c.importance, "heuristic")
