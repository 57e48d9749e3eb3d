"""Heuristic memory classifier (tier 1 of the seeds' heuristic → centroid → LLM pipeline).

Scores a drawer against regex markers for the seven memory types, adds a length bonus, and turns
the best score into a confidence: ``min(1, (best + length_bonus) / 5)``. A sentiment pass
disambiguates (a problem that was resolved on a positive note is a milestone). Importance (0–5)
follows the type's base weight, emphasis cues and confidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MEMORY_TYPES", "Classification", "classify"]

MEMORY_TYPES = ("decision", "preference", "milestone", "problem", "emotional", "fact", "task")

_P = dict[str, list[str]]
_MARKERS: _P = {
    "decision": [
        r"\bwe (?:decided|chose|picked|agreed|settled|went with|will use|are going with)\b",
        r"\b(?:decided|decision|chose|choose|opted|settled on|went with|switch(?:ed)? to|migrat\w+ to)\b",
        r"\binstead of\b", r"\btrade-?offs?\b", r"\bover\b.{1,40}\bbecause\b", r"\bgoing forward\b",
        r"\blet'?s (?:use|go with|stick with)\b", r"\barchitecture\b", r"\bapproach\b",
    ],
    "preference": [
        r"\bi (?:really )?(?:prefer|like|love|enjoy|hate|dislike|can'?t stand|am into|adore)\b",
        r"\b(?:my )?favou?rite\b", r"\bprefer(?:s|red|ence)?\b", r"\b(?:always|never) (?:use|want|do)\b",
        r"\brather than\b", r"\bi'?m (?:a big )?fan of\b", r"\bstyle\b", r"\bplease (?:always|never)\b",
        r"\bi want\b", r"\bi'?d like\b",
    ],
    "milestone": [
        r"\b(?:finally|finished|completed|shipped|launched|released|deployed|achieved|graduated)\b",
        r"\b(?:got|landed) (?:the|a|my) (?:job|offer|promotion|role)\b", r"\bmilestone\b",
        r"\b(?:breakthrough|succeeded|success(?:fully)?|accomplish\w*|won|passed)\b",
        r"\bit works\b", r"\bgot it working\b", r"\bmerged\b", r"\bfirst (?:time|ever)\b",
    ],
    "problem": [
        r"\b(?:bug|error|exception|crash(?:es|ed)?|broken|fail(?:s|ed|ing|ure)?|issue|problem)\b",
        r"\b(?:doesn'?t|does not|won'?t|can'?t|cannot) (?:work|start|connect|load|run)\b",
        r"\broot cause\b", r"\b(?:stack ?trace|traceback|timeout|leak|regression|outage)\b",
        r"\b(?:struggl\w+|stuck|trouble|difficult\w*|hard time)\b", r"\bfix(?:ed)?\b",
    ],
    "emotional": [
        r"\bi (?:feel|felt|am feeling)\b", r"\b(?:happy|sad|excited|anxious|worried|stressed|proud|"
        r"grateful|thankful|frustrated|upset|lonely|scared|afraid|nervous|overwhelmed|thrilled|"
        r"heartbroken|depressed|angry|joy|love you|miss(?:ed)? you)\b",
        r"\b(?:means a lot|so glad|tough time|hard time|rough day|cheer up)\b", r"[!]{2,}",
        r"\b(?:morale|burn(?:ed|t)? out|motivat\w+)\b",
    ],
    "fact": [
        r"\b(?:i am|i'm|my name is|i live|i work|i was born|i have|i've got)\b",
        r"\b(?:is|are|was|were) (?:a|an|the|located|based|born|called|named)\b",
        r"\b(?:my|our) (?:wife|husband|partner|son|daughter|kids?|mom|mother|dad|father|sister|brother|"
        r"dog|cat|team|company|job|address|birthday)\b",
        r"\b\d{4}\b", r"\b(?:uses?|runs? on|depends on|version)\b", r"\b(?:years? old|lives? in|works? (?:at|as))\b",
    ],
    "task": [
        r"\b(?:todo|to-do|to do|need to|needs to|have to|has to|must|should|going to|plan(?:ning)? to)\b",
        r"\b(?:remind me|don'?t forget|remember to|next (?:step|week|time)|deadline|by (?:monday|tuesday|"
        r"wednesday|thursday|friday|tomorrow|tonight|next week))\b",
        r"\b(?:will|i'll|we'll) (?:do|finish|send|write|call|fix|add|check)\b", r"\bwip\b", r"\bin progress\b",
    ],
}
_COMPILED = {t: [re.compile(p, re.IGNORECASE) for p in ps] for t, ps in _MARKERS.items()}
_POSITIVE = re.compile(
    r"\b(?:great|good|awesome|happy|glad|love|excellent|amazing|proud|excited|thrilled|works|solved|"
    r"resolved|fixed|finally|success\w*)\b",
    re.IGNORECASE,
)
_NEGATIVE = re.compile(
    r"\b(?:bad|sad|terrible|awful|hate|angry|upset|worried|broken|fail\w*|frustrat\w*|annoy\w*|stuck)\b",
    re.IGNORECASE,
)
_RESOLUTION = re.compile(r"\b(?:fixed|solved|resolved|works now|got it working|figured (?:it )?out)\b", re.I)
_EMPHASIS = re.compile(
    r"\b(?:important|critical|crucial|always|never|must|remember|key|essential|priority|urgent)\b", re.I
)
_BASE_IMPORTANCE = {
    "decision": 4.0, "milestone": 4.0, "problem": 3.5, "preference": 3.5,
    "task": 3.0, "emotional": 3.0, "fact": 3.0,
}


@dataclass(frozen=True, slots=True)
class Classification:
    """Outcome of classifying one drawer."""

    memory_type: str
    confidence: float
    importance: float
    scores: dict[str, float]


def _score(text: str) -> dict[str, float]:
    return {t: float(sum(1 for rx in rxs if rx.search(text))) for t, rxs in _COMPILED.items()}


def classify(text: str) -> Classification:
    """Classify one drawer's text into a memory type with confidence and importance.

    Args:
        text: the drawer content (verbatim).

    Returns:
        The best type (``fact`` when nothing matches), a confidence in [0, 1] and an importance
        in [0, 5].
    """
    scores = _score(text)
    length_bonus = 2.0 if len(text) > 500 else 1.0 if len(text) > 200 else 0.0
    pos = len(_POSITIVE.findall(text))
    neg = len(_NEGATIVE.findall(text))
    # Disambiguation as in the seeds: a resolved problem told with relief is a milestone.
    if scores["problem"] and _RESOLUTION.search(text) and pos >= neg:
        scores["milestone"] += 1.0 + scores["problem"] / 2
    if scores["emotional"] and (pos + neg) >= 2:
        scores["emotional"] += 1.0
    best_type = max(MEMORY_TYPES, key=lambda t: (scores[t], -MEMORY_TYPES.index(t)))
    best = scores[best_type]
    if best == 0:
        best_type = "fact"
    confidence = min(1.0, (best + length_bonus) / 5.0) if best else min(0.3, length_bonus / 5.0)
    emphasis = len(_EMPHASIS.findall(text))
    importance = _BASE_IMPORTANCE[best_type] * (0.6 + 0.4 * confidence) + min(1.0, 0.5 * emphasis)
    if best == 0:
        importance = 2.0 + min(1.0, len(text) / 800)
    importance = round(max(0.0, min(5.0, importance)), 3)
    return Classification(best_type, round(confidence, 3), importance, scores)
