"""Heuristic memory classifier (phase 1 of the seeds' heuristic → centroid → LLM pipeline).

Scores a drawer against regex markers for the seven memory types, adds a length bonus, and turns
the best score into a confidence: ``min(1, (best + length_bonus) / 5)``. A sentiment pass
disambiguates (a problem that was resolved on a positive note is a milestone). Importance (0–5)
follows the type's base weight, emphasis cues and confidence.

The markers, sentiment lists and weights live in ``classify_markers.json`` (shipped as package
data) so they can be tuned against the hand-labelled sample in tests/data without touching code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["MEMORY_TYPES", "Classification", "HeuristicConfig", "classify", "load_config"]

MEMORY_TYPES = ("decision", "preference", "milestone", "problem", "emotional", "fact", "task")


_ESCAPE = re.compile(r"\\.")
_UPPER = re.compile(r"[A-Z]")


def _lower_case(patterns: list[str]) -> list[str]:
    """The patterns, refused if one names an upper-case letter: they are matched against the lower-cased
    text: ``re.IGNORECASE`` makes Python's matcher fold the case of every character it tries, for every
    pattern, where lower-casing the text is one pass (a pattern with a capital would silently never match)."""
    for p in patterns:
        if _UPPER.search(_ESCAPE.sub("", p)):
            raise ValueError(f"classifier patterns are matched against lower-cased text; write {p!r} in lower case")
    return patterns


def _rx(patterns: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in _lower_case(patterns)))


@dataclass(frozen=True)
class HeuristicConfig:
    """The compiled contents of a marker configuration."""

    markers: dict[str, list[re.Pattern[str]]]
    # Each type's markers as one alternation: it matches somewhere exactly when one of them does, so a
    # type none of whose markers occur costs one pass over the text instead of one per marker.
    any_marker: dict[str, re.Pattern[str]]
    positive: re.Pattern[str]
    negative: re.Pattern[str]
    resolution: re.Pattern[str]
    emphasis: re.Pattern[str]
    base_importance: dict[str, float]
    length_bonus: list[tuple[int, float]]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HeuristicConfig:
        """Compile a configuration; a type missing from ``markers`` or an unknown one is an error."""
        markers = raw["markers"]
        if set(markers) != set(MEMORY_TYPES):
            raise ValueError(f"markers must name exactly {MEMORY_TYPES}, got {sorted(markers)}")
        return cls(
            markers={t: [re.compile(p) for p in _lower_case(markers[t])] for t in MEMORY_TYPES},
            any_marker={t: _rx(markers[t]) for t in MEMORY_TYPES},
            positive=_rx(raw["positive"]), negative=_rx(raw["negative"]),
            resolution=_rx(raw["resolution"]), emphasis=_rx(raw["emphasis"]),
            base_importance={t: float(raw["base_importance"][t]) for t in MEMORY_TYPES},
            length_bonus=sorted(((int(n), float(b)) for n, b in raw["length_bonus"]), reverse=True),
        )


@lru_cache(maxsize=1)
def load_config() -> HeuristicConfig:
    """The shipped configuration (``shared/memory/classify_markers.json``), compiled once."""
    text = resources.files("shared.memory").joinpath("classify_markers.json").read_text(encoding="utf-8")
    return HeuristicConfig.from_dict(json.loads(text))


@dataclass(frozen=True, slots=True)
class Classification:
    """Outcome of classifying one drawer."""

    memory_type: str
    confidence: float
    importance: float
    scores: dict[str, float]


def classify(text: str, config: HeuristicConfig | None = None) -> Classification:
    """Classify one drawer's text into a memory type with confidence and importance.

    Args:
        text: the drawer content (verbatim).
        config: markers and weights; the shipped configuration when omitted.

    Returns:
        The best type (``fact`` when nothing matches), a confidence in [0, 1] and an importance
        in [0, 5].
    """
    cfg = config or load_config()
    low = text.lower()  # the patterns are lower case (HeuristicConfig.from_dict)
    scores = {t: float(sum(1 for rx in rxs if rx.search(low))) if cfg.any_marker[t].search(low) else 0.0
              for t, rxs in cfg.markers.items()}
    length_bonus = next((b for n, b in cfg.length_bonus if len(text) > n), 0.0)
    pos = len(cfg.positive.findall(low))
    neg = len(cfg.negative.findall(low))
    # Disambiguation as in the seeds: a resolved problem told with relief is a milestone.
    if scores["problem"] and cfg.resolution.search(low) and pos >= neg:
        scores["milestone"] += 1.0 + scores["problem"] / 2
    # Feelings carried by a report of what happened (a win, a trip) are that report, not a mood.
    if scores["emotional"] and (pos + neg) >= 2 and not (scores["milestone"] or scores["fact"]):
        scores["emotional"] += 1.0
    best_type = max(MEMORY_TYPES, key=lambda t: (scores[t], -MEMORY_TYPES.index(t)))
    best = scores[best_type]
    if best == 0:
        best_type = "fact"
    confidence = min(1.0, (best + length_bonus) / 5.0) if best else min(0.3, length_bonus / 5.0)
    emphasis = len(cfg.emphasis.findall(low))
    importance = cfg.base_importance[best_type] * (0.6 + 0.4 * confidence) + min(1.0, 0.5 * emphasis)
    if best == 0:
        importance = 2.0 + min(1.0, len(text) / 800)
    importance = round(max(0.0, min(5.0, importance)), 3)
    return Classification(best_type, round(confidence, 3), importance, scores)
