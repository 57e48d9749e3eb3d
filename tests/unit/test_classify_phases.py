"""The three classification phases: the heuristic against hand labels, centroids, routing, and the
strict reading of LLM answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.memory.centroids import compute_centroids, nearest_type, source_hash
from shared.memory.classify import MEMORY_TYPES, Classification, HeuristicConfig, classify, load_config
from shared.memory.llm_labels import LlmParseError, parse_batch, strip_wrappers
from shared.memory.phases import decide

LABELS = Path(__file__).parents[1] / "data" / "locomo_type_labels.json"
# Correct heuristic labels on the 210 hand-labelled turns when the markers were last tuned.
HEURISTIC_CORRECT_FLOOR = 130


def test_labelled_sample_is_large_and_valid() -> None:
    rows = json.loads(LABELS.read_text())["labels"]
    assert len(rows) >= 200
    assert {r["label"] for r in rows} <= set(MEMORY_TYPES)
    assert len({(r["sample_id"], r["dia_id"]) for r in rows}) == len(rows)


def test_heuristic_accuracy_does_not_regress() -> None:
    rows = json.loads(LABELS.read_text())["labels"]
    correct = sum(classify(r["text"]).memory_type == r["label"] for r in rows)
    assert correct >= HEURISTIC_CORRECT_FLOOR, f"{correct}/{len(rows)} correct"


def test_config_must_name_every_type() -> None:
    raw = json.loads((Path(__file__).parents[2] / "shared/memory/classify_markers.json").read_text())
    del raw["markers"]["task"]
    with pytest.raises(ValueError, match="markers must name"):
        HeuristicConfig.from_dict(raw)
    assert load_config() is load_config()



def test_markers_are_lower_case_and_match_any_case() -> None:
    """The text is lower-cased once and the markers compiled without IGNORECASE: a marker with a capital is
    refused (it would never match), escapes such as ``\\b`` are not capitals, and upper-case text matches."""
    raw = json.loads((Path(__file__).parents[2] / "shared/memory/classify_markers.json").read_text())
    raw["markers"]["task"] = [*raw["markers"]["task"], r"\bTodo\b"]
    with pytest.raises(ValueError, match="lower case"):
        HeuristicConfig.from_dict(raw)
    raw["markers"]["task"][-1] = r"\btodo\b\S*\W"
    assert classify("TODO: ship it", HeuristicConfig.from_dict(raw)).scores["task"] >= 1
    assert classify("I AM SO HAPPY AND PROUD").scores == classify("i am so happy and proud").scores

def test_resolved_problem_with_relief_is_a_milestone() -> None:
    assert classify("The login bug was broken for days but I finally fixed it, so happy it works now").memory_type \
        == "milestone"
    assert classify("The login bug is still broken and the deploy failed again").memory_type == "problem"


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_centroid_gate_and_minimum_samples() -> None:
    cents = compute_centroids([("task", _unit([1, 0, 0]))] * 60 + [("fact", _unit([0, 1, 0]))] * 10)
    assert {c.memory_type: c.sample_count for c in cents} == {"task": 60, "fact": 10}
    hit = nearest_type(_unit([1, 0.1, 0]), cents, min_cosine=0.85, min_samples=50)
    assert hit is not None and hit[0] == "task" and hit[1] > 0.85
    assert nearest_type(_unit([0, 1, 0]), cents, min_cosine=0.85, min_samples=50) is None  # fact: too few
    assert nearest_type(_unit([1, 1, 0]), cents, min_cosine=0.85, min_samples=50) is None  # cosine 0.71


def test_source_hash_ignores_order_and_sees_relabels() -> None:
    a = [("d1", "task"), ("d2", "fact")]
    assert source_hash(a) == source_hash(list(reversed(a)))
    assert source_hash(a) != source_hash([("d1", "task"), ("d2", "decision")])


@pytest.mark.parametrize(("conf", "hit", "llm", "tier", "mtype"), [
    (0.9, ("task", 0.9), True, "heuristic", "fact"),
    (0.6, ("task", 0.9), True, "centroid", "task"),
    (0.6, None, True, "llm", "fact"),
    (0.3, ("task", 0.9), True, "llm", "fact"),
    (0.3, None, False, "heuristic", "fact"),
    (0.6, None, False, "heuristic", "fact"),
])
def test_phase_routing(conf: float, hit: tuple[str, float] | None, llm: bool, tier: str, mtype: str) -> None:
    d = decide(Classification("fact", conf, 3.0, {}), low=0.5, high=0.8, centroid_hit=hit, llm_enabled=llm)
    assert (d.tier, d.memory_type) == (tier, mtype)


def test_think_blocks_and_fences_are_stripped() -> None:
    raw = '<think>let me see {"not": "this"}</think>\n```json\n{"items": []}\n```'
    assert strip_wrappers(raw) == '{"items": []}'
    assert strip_wrappers('reasoning without an opening tag</think>{"a": 1}') == '{"a": 1}'


def test_partial_results_survive_with_warnings() -> None:
    answer = json.dumps({"items": [
        {"id": "a", "memory_type": "Decision", "importance": 9, "summary": "Chose Postgres\nmore",
         "entities": [{"name": "Postgres", "type": "tool"}, {"bad": 1}],
         "triples": [{"subject": "team", "predicate": "uses", "object": "Postgres"}, {"subject": "x"}]},
        {"id": "b", "memory_type": "gossip"},
        {"id": "zzz-invented", "memory_type": "fact"},
    ]})
    parsed = parse_batch(answer, ["a", "b"])
    assert set(parsed.labels) == {"a"}
    a = parsed.labels["a"]
    assert (a.memory_type, a.importance, a.summary) == ("decision", None, "Chose Postgres")
    assert a.entities == [("Postgres", "tool")] and a.triples == [("team", "uses", "Postgres")]
    assert len(a.warnings) == 3  # importance, entity, triple
    assert any("not asked for" in w for w in parsed.warnings) and any("b: invalid" in w for w in parsed.warnings)


def test_control_characters_in_an_answer_never_reach_the_database() -> None:
    """A model answering "\u0000" in a string: PostgreSQL refuses NUL in text, and the write of every label
    of the event failed with it. Every parser's strings come without control characters."""
    from shared.memory.contradiction import parse_verdict
    from shared.memory.decisions import parse_proposal

    answer = json.dumps({"items": [{"id": "a", "memory_type": "fact", "summary": "bad\u0000x\u0007y",
                                    "entities": [{"name": "Ac\u0000me", "type": "org"}]}]})
    a = parse_batch(answer, ["a"]).labels["a"]
    assert a.summary == "badxy" and a.entities == [("Acme", "org")]
    verdict = parse_verdict(json.dumps({"contradicts": True, "reason": "flag\u0000 flipped"}))
    assert verdict.reason == "llm: flag flipped"
    p = parse_proposal(json.dumps({"action": "UPDATE", "target_id": "t", "content": "new\u0000 text",
                                   "confidence": 0.9, "reason": "r\u0000"}))
    assert (p.content, p.reason) == ("new text", "r")


def test_unreadable_answer_is_a_parse_error() -> None:
    with pytest.raises(LlmParseError):
        parse_batch("Sure! Here are the labels: decision, fact", ["a"])
    with pytest.raises(LlmParseError):
        parse_batch('{"labels": {}}', ["a", "b"])


@pytest.mark.parametrize(("older", "newer", "expected"), [
    ("Dark mode is enabled for the billing dashboard", "Dark mode is disabled for the billing dashboard", True),
    ("We use Postgres for the billing service", "We no longer use Postgres for the billing service", True),
    ("The API allows anonymous uploads", "The API denies anonymous uploads", True),
    ("We use Postgres for the billing service", "We use Postgres for the search service", False),
    ("I love hiking in the mountains", "I went to the beach yesterday and did not swim", False),
    ("Dark mode is not enabled", "Dark mode is not enabled yet", False),
    ("Dark mode is enabled for billing", "Dark mode isn't really enabled for billing", True),
    # Negations that deny nothing the other side says (LoCoMo-dev pleasantries the detector used to flag).
    ("Thanks! I'm going for my dreams!", "Thanks! Keep going for your dreams and don't quit!", False),
    ("Take care! Can't wait to catch up. Talk soon!", "Take care! Keep pushing on. Talk soon.", False),
    ("Thanks for being there for me. Your help means a lot.",
     "Sure thing, Gina! Your help means a lot to me. I'm not giving up.", False),
    ("Hey Joanna! Haven't talked with you in a while - how's it going?",
     "Hey Joanna, what's been up since we last chatted? How's it going?", False),
    ("The export API is enabled, don't worry", "The export API is disabled", True),  # the antonyms still count
])
def test_lexical_contradiction(older: str, newer: str, expected: bool) -> None:
    from shared.memory.contradiction import lexical_contradiction

    assert lexical_contradiction(older, newer).contradicts is expected


def test_llm_verdict_parsing() -> None:
    from shared.memory.contradiction import parse_verdict

    v = parse_verdict('<think>hmm</think>```json\n{"contradicts": true, "reason": "flag flipped"}\n```')
    assert v.contradicts and v.reason == "llm: flag flipped"
    with pytest.raises(LlmParseError):
        parse_verdict('{"contradicts": "maybe"}')


def test_superseded_drawer_ranks_below_its_successor() -> None:
    from shared.memory.ranking import Candidate, RankParams, rank

    def cand(i: str, cos: float, tf: int, successor: str | None = None) -> Candidate:
        return Candidate(i, None, None, cos, {"dark": tf, "mode": 1}, 4, frozenset(), False, 3.0, 1.0, successor)

    # the older one is the better match on its own, but a newer drawer contradicted it
    cands = [cand("old", 0.95, 2, "new"), cand("new", 0.9, 1), cand("other", 0.5, 0)]
    ranked = rank(cands, ["dark", "mode"], RankParams(session_cap=0), 3)
    assert [r.id for r in ranked][:2] == ["new", "old"]
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    # without the successor among the candidates it only loses part of its score
    alone = rank([cand("old", 0.95, 2, "new"), cand("other", 0.5, 0)], ["dark", "mode"], RankParams(session_cap=0), 2)
    assert alone[0].id == "old"


@pytest.mark.parametrize(("status", "transient"), [(429, True), (500, True), (502, True), (503, True),
                                                   (400, False), (401, False), (403, False), (404, False),
                                                   (422, False)])
def test_only_timeouts_429_and_5xx_are_retried(status: int, transient: bool) -> None:
    import httpx
    import openai

    from shared.adapters.llm import is_transient_llm

    req = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    err = openai.APIStatusError("x", response=httpx.Response(status, request=req), body=None)
    assert is_transient_llm(err) is transient
    assert is_transient_llm(openai.APITimeoutError(request=req))
    assert is_transient_llm(openai.APIConnectionError(request=req))
    assert not is_transient_llm(ValueError("unreadable answer"))


@pytest.mark.parametrize(("older", "newer", "expected"), [
    ("Caroline", "Caroline", True),
    ("Caroline", " caroline ", True),  # names as chat platforms send them
    ("Mary  Ann", "mary ann", True),
    ("Caroline", "Melanie", False),  # two people disagreeing: two facts
    (None, "Melanie", True),  # a message without a name: compared as before
    ("Caroline", None, True),
    (None, None, True),
    ("", "Melanie", True),
])
def test_only_the_same_voice_supersedes(older: str | None, newer: str | None, expected: bool) -> None:
    from shared.memory.contradiction import same_voice

    assert same_voice(older, newer) is expected
