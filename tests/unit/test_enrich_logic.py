"""Pure enrichment logic: de-dup decisions, extractive summaries, entity extraction."""

from shared.memory.dedup import decide
from shared.memory.entities import entity_id, extract_entities
from shared.memory.episodes import summarize_session, top_keywords


def test_dedup_decision_threshold() -> None:
    assert decide(("a", 0.99), 0.97).action == "MERGE"
    assert decide(("a", 0.90), 0.97).action == "NONE"
    assert decide(None, 0.97).action == "NONE"


def test_summary_keeps_order_and_speakers() -> None:
    d = summarize_session([("Ann", "We decided to move the launch to March."), ("Bob", "ok then"),
                           ("Ann", "I feel relieved, honestly.")], max_sentences=2)
    assert d.summary.startswith("Ann: We decided")
    assert len(d.abstract) <= 200
    assert "launch" in d.topics


def test_keywords_skip_stopwords() -> None:
    assert top_keywords(["the the the postgres postgres and"], 2) == ["postgres"]


def test_entities_names_and_people() -> None:
    names = {n: t for n, t in extract_entities("Maria met Tomás in Lisbon to discuss PostgreSQL.", ("Maria",))}
    assert names["Maria"] == "person"
    assert {"Tomás", "Lisbon", "PostgreSQL"} <= set(names)


def test_entity_ids_normalise_case() -> None:
    assert entity_id("w", "PostgreSQL") == entity_id("w", "postgresql ")
    assert entity_id("w", "x") != entity_id("v", "x")
