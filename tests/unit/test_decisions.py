"""Write decisions (pure): normalisation and hashing, parsing, validation, what each mode allows."""

from __future__ import annotations

import pytest

from shared.memory.decisions import Proposal, content_hash, normalise, outcome_for, parse_proposal, validate
from shared.memory.llm_labels import LlmParseError


def test_normalised_hash_ignores_case_spacing_and_edge_punctuation() -> None:
    assert normalise("  Maria  prefers TEA.\n") == "maria prefers tea"
    assert content_hash("Maria prefers tea") == content_hash("maria   prefers tea!")
    assert content_hash("Maria prefers tea") != content_hash("Maria prefers coffee")
    assert len(content_hash("x")) == 64


def test_parse_proposal() -> None:
    p = parse_proposal('<think>x</think>```json\n{"action": "update", "target_id": "d1", "reason": "newer",'
                       ' "confidence": 0.8, "content": "Maria prefers coffee"}\n```')
    assert (p.action, p.target, p.reason, p.confidence, p.content) == ("UPDATE", "d1", "newer", 0.8,
                                                                       "Maria prefers coffee")
    with pytest.raises(LlmParseError):
        parse_proposal("I would add it")


@pytest.mark.parametrize(("p", "why"), [
    (Proposal("ADD", None, "new", 0.9), None),
    (Proposal("UPDATE", "d1", "newer", 0.9, "text"), None),
    (Proposal("DELETE", "d9", "gone", 0.9), "not one of the candidates"),
    (Proposal("DELETE", "d1", "", 0.9), "no reason"),
    (Proposal("DELETE", "d1", "gone", 0.5), "under the gate"),
    (Proposal("UPDATE", "d1", "newer", 0.9), "without the new content"),
    (Proposal("MERGE", "d1", "x", 0.9), "unknown action"),
])
def test_validate(p: Proposal, why: str | None) -> None:
    got = validate(p, {"d1", "d2"}, gate=0.7)
    assert (got is None) if why is None else (got is not None and why in got)


def test_modes() -> None:
    assert [outcome_for("shadow", a) for a in ("ADD", "UPDATE")] == ["shadow", "shadow"]
    assert [outcome_for("controlled-write", a) for a in ("ADD", "NONE", "UPDATE", "DELETE")] == [
        "applied", "applied", "held", "held"]
    assert [outcome_for("full", a) for a in ("UPDATE", "DELETE")] == ["applied", "applied"]
