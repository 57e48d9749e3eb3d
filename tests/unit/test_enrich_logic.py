"""Pure enrichment logic: de-dup decisions, extractive summaries, entity extraction."""

from shared.memory.dedup import decide
from shared.memory.entities import entity_id, extract_entities
from shared.memory.episodes import summarize_session, top_keywords


def test_dedup_needs_close_embedding_and_near_verbatim_wording() -> None:
    text = "We moved the weekly sync to Thursdays at 10am."
    assert decide(text, [("a", 0.99, "we moved the weekly sync to thursdays at 10am")], 0.9).action == "MERGE"
    # Close in embedding space but a different statement: kept.
    assert decide(text, [("a", 0.99, "We moved the weekly retro to Fridays at 4pm.")], 0.9).action == "NONE"
    # Near-verbatim but the embedding says unrelated (below threshold): not even considered.
    assert decide(text, [("a", 0.5, text)], 0.9).action == "NONE"
    assert decide(text, [], 0.9).action == "NONE"
    # The first qualifying twin (nearest first) wins.
    d = decide(text, [("a", 0.97, "Something else entirely here."), ("b", 0.95, text)], 0.9)
    assert (d.action, d.target) == ("MERGE", "b")


def test_a_near_verbatim_sentence_with_a_new_name_or_number_is_a_new_fact_not_a_duplicate() -> None:
    """One word apart is near-verbatim by any ratio; merged, the newer fact would leave recall behind the older."""
    moved = "I moved to Berlin in March and I work at Acme as a backend engineer now."
    assert decide(moved.replace("Berlin", "Munich"), [("a", 0.96, moved)], 0.92).action == "NONE"
    kept = "The retention period for invoices is 30 days in the billing service settings."
    assert decide(kept.replace("30", "90"), [("a", 0.99, kept)], 0.9).action == "NONE"
    # Filler words alone do not make a new fact.
    sync = "We moved the weekly sync to Thursdays at 10am"
    assert decide("We just moved the weekly sync to Thursdays at 10am.", [("a", 0.99, sync)], 0.9).action == "MERGE"


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


def test_a_short_session_keeps_every_turn_in_order() -> None:
    # No more turns than max_sentences: all are kept, in conversation order, whatever their importance.
    turns = [("Bob", "ok then"), ("Ann", "We decided to move the launch to March."), ("Bob", "fine")]
    d = summarize_session(turns, max_sentences=3)
    assert d.summary == "Bob: ok then Ann: We decided to move the launch to March. Bob: fine"
    # One turn more than max_sentences: the least important one leaves, the rest keep their order.
    d = summarize_session([*turns, ("Ann", "I was so relieved we finally shipped the release, it was huge!")],
                          max_sentences=3)
    assert d.summary.startswith("Bob: ") and "launch to March" in d.summary and "relieved" in d.summary
    assert d.summary.count("Bob: ") == 1


def test_enrich_kg_runs_its_batches_one_at_a_time() -> None:
    """Without a model a batch is CPU and statements, and batches side by side only queue on the new
    entities they share; with one, batches side by side would queue their episodes on the model's slots, and
    that wait counts against each batch's handler budget. Either way the process runs one batch at a time."""
    from services._runtime import Deps
    from services.enrich.app import SPEC
    from shared.config import Settings
    from shared.consumers import PullConsumer, consumer

    c = consumer("enrich-kg")
    for settings in (Settings(), Settings(llm_base_url="http://127.0.0.1:9/v1")):
        deps = Deps(settings=settings, service="enrich", pool=None, broker=None)  # type: ignore[arg-type]
        SPEC.register(deps)
        puller = PullConsumer(js=None, broker=None, settings=settings, c=c, handler=deps.handlers[c.durable],
                              dead_letter=None, window=deps.windows.get(c.durable))  # type: ignore[arg-type]
        assert puller.window == 1