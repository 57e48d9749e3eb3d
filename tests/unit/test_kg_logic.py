"""Pure knowledge-graph logic: names, predicates, time arguments, word keys for the linker."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from shared.memory.entities import entity_id as extractor_entity_id
from shared.memory.kg import (
    KgError,
    anchor_word,
    as_of_window,
    entity_id,
    match_key,
    normalize_name,
    normalize_predicate,
    parse_direction,
    parse_when,
    pick_links,
    text_words,
    triple_id,
    validate_name,
)


def test_one_entity_per_spelling_and_one_normaliser() -> None:
    assert normalize_name("  PostgreSQL ") == normalize_name("postgresql") == normalize_name("ＰｏｓｔｇｒｅＳＱＬ")
    assert entity_id("w", "Crawbl  Backend") == entity_id("w", "crawbl backend") != entity_id("w2", "crawbl backend")
    # The pattern extractor uses the same ids as the graph functions.
    assert extractor_entity_id is entity_id


def test_names_are_validated() -> None:
    assert validate_name("  Alice \n Smith ") == "Alice Smith"
    for bad in ("", "   ", "x" * 201, "a\x07b"):
        with pytest.raises(KgError):
            validate_name(bad)


def test_predicates_compare_by_words() -> None:
    assert normalize_predicate("Works At") == normalize_predicate("works-at") == normalize_predicate(" works_at ")
    assert normalize_predicate("uses") == "uses"
    for bad in ("", " - _ ", "x" * 101):
        with pytest.raises(KgError):
            normalize_predicate(bad)


def test_times_parse_to_aware_instants() -> None:
    assert parse_when("2025-01-14") == datetime(2025, 1, 14, tzinfo=UTC)
    assert parse_when("2025-01-14T10:00:00Z") == datetime(2025, 1, 14, 10, tzinfo=UTC)
    assert parse_when(datetime(2025, 1, 14, 10)) == datetime(2025, 1, 14, 10, tzinfo=UTC)
    plus2 = datetime(2025, 1, 14, 12, tzinfo=timezone(timedelta(hours=2)))
    assert parse_when(plus2) == datetime(2025, 1, 14, 10, tzinfo=UTC)
    assert parse_when(None) is None
    with pytest.raises(KgError):
        parse_when("last tuesday")
    with pytest.raises(KgError):
        parse_when(42)  # type: ignore[arg-type]


def test_as_of_a_date_is_the_whole_day_and_a_time_is_an_instant() -> None:
    lo, hi = as_of_window(date(2025, 1, 14)) or (None, None)
    assert lo == datetime(2025, 1, 14, tzinfo=UTC) and hi is not None and hi.date() == date(2025, 1, 14)
    assert hi > datetime(2025, 1, 14, 23, 59, tzinfo=UTC)
    assert as_of_window("2025-01-14") == as_of_window(date(2025, 1, 14))
    t = datetime(2025, 1, 14, 10, tzinfo=UTC)
    assert as_of_window(t) == (t, t)
    assert as_of_window(None) is None


def test_directions() -> None:
    assert [parse_direction(d) for d in ("out", "IN", "both", "outgoing")] == ["outgoing", "incoming", "both",
                                                                              "outgoing"]
    with pytest.raises(KgError):
        parse_direction("sideways")


def test_triple_ids_depend_on_when_it_was_said() -> None:
    a = datetime(2025, 1, 1, tzinfo=UTC)
    assert triple_id("w", "s", "uses", "o", a) == triple_id("w", "s", "uses", "o", a.astimezone(
        timezone(timedelta(hours=5))))
    assert triple_id("w", "s", "uses", "o", a) != triple_id("w", "s", "uses", "o", a + timedelta(seconds=1))


def test_names_are_found_as_whole_words() -> None:
    t = text_words("Yesterday Caroline's friend moved our API to Node.js, then to PostgreSQL 16.")
    assert match_key("Caroline") in t.words and "caroline" in t.capitalised
    assert match_key("Node.js") == "node.js" and "node.js" in t.words
    assert f" {match_key('PostgreSQL 16')} " in t.joined
    assert "line" not in t.words  # inside a word is not a match
    assert "max" not in text_words("we ran at max speed").capitalised
    assert "max" in text_words("I walked Max").capitalised


def test_a_name_is_looked_up_by_its_longest_word() -> None:
    assert anchor_word(match_key("The Beatles")) == "beatles"
    assert anchor_word(match_key("Bank of America")) == "america"
    assert anchor_word("new york") == "york" and anchor_word("ab cd") == "ab"
    assert anchor_word("") == ""


def test_pick_links_needs_the_capital_a_one_word_name_was_written_with() -> None:
    aliases = [("max", "dog", True), ("orion", "proj", True), ("new york", "ny", True), ("sql", "sql", False),
               ("york", "yk", True)]
    assert pick_links(text_words("I walked Max to the Orion site"), aliases) == {"dog", "proj"}
    assert pick_links(text_words("we ran at max speed"), aliases) == set()
    assert pick_links(text_words("moving to new york, writing SQL"), aliases) == {"ny", "sql"}
    assert pick_links(text_words("a newyork café"), aliases) == set()
    assert pick_links(text_words("What's up? So I'm here."), [("what", "w", True), ("so i'm", "s", True)]) == set()


@pytest.mark.parametrize("when", ["9999-12-31T23:30:00-01:00", "0001-01-01T00:00:00+01:00", "0001-06-01"])
def test_a_time_the_database_could_not_read_back_is_refused(when: str) -> None:
    """Stored, such an instant (year 10000, or year 0, in UTC) made every later read of its fact fail."""
    with pytest.raises(KgError, match="outside the years"):
        parse_when(when, "valid_from")
    assert parse_when("9998-12-31") is not None and parse_when("0002-01-01T00:00:00Z") is not None
    assert parse_when(when, "as_of", stored=False) is not None  # a question's bound is never stored
