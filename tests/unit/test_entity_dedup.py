"""Entity dedup rules (shared.memory.entity_dedup): merges need evidence a name alone cannot fake."""

from __future__ import annotations

from shared.memory.entity_dedup import Candidate, canonical_name, decide_pair, dedup_keys, types_conflict


def c(eid: str, name: str, etype: str = "concept", mentions: int = 1, **kw: object) -> Candidate:
    return Candidate(eid, name, etype, mentions, **kw)  # type: ignore[arg-type]


def decide(a: Candidate, b: Candidate, **kw: object) -> tuple[str, str, str | None, str | None]:
    d = decide_pair(a, b, context_threshold=0.8, **kw)  # type: ignore[arg-type]
    return d.action, d.rule, d.survivor, d.loser


def test_canonical_names_fold_accents_punctuation_and_possessives() -> None:
    assert canonical_name("Tomás") == canonical_name("tomas") == "tomas"
    assert canonical_name("Node.js") == canonical_name("NodeJS") == canonical_name("node js")
    assert canonical_name("Mel's") == canonical_name("Mel")
    assert canonical_name("The Beatles") == canonical_name("Beatles")
    assert canonical_name("Caroline") != canonical_name("Carolina")
    assert canonical_name("!!!") == ""


def test_names_made_of_symbols_stay_apart() -> None:
    """C++, C# and C are three languages: folding punctuation must not fold the symbols that make a name."""
    assert len({canonical_name(n) for n in ("C++", "C#", "C", "F#", "F")}) == 5
    assert canonical_name("AT&T") != canonical_name("ATT") and canonical_name("c ++") == canonical_name("C++")
    for a, b in (("C++", "C#"), ("C++", "C"), ("C#", "C")):
        assert decide(c("a", a, "technology", 4), c("b", b, "technology", 2))[0] != "merge", (a, b)


def test_keys_find_short_names_and_spelling_variants() -> None:
    assert dedup_keys("Caroline Smith") == ["n:carolinesmith", "b:caro", "w:caroline", "w:smith"]
    assert dedup_keys("Carolina") == ["n:carolina", "b:caro"]
    assert dedup_keys("Bank of America") == ["n:bankofamerica", "b:bank", "w:bank", "w:america"]
    assert dedup_keys("...") == []


def test_same_name_written_two_ways_merges_into_the_better_known() -> None:
    assert decide(c("a", "Tomás", "person", 1), c("b", "Tomas", "person", 5)) == ("merge", "same_name", "b", "a")
    # Equal mentions: the smaller id wins, so replicas deciding independently agree.
    assert decide(c("b", "Node.js"), c("a", "NodeJS", "technology")) == ("merge", "same_name", "a", "b")


def test_mel_the_person_is_never_merged_with_mels_the_place() -> None:
    assert types_conflict("person", "place") and not types_conflict("person", "concept")
    assert types_conflict("PERSON", "GPE") and not types_conflict("city", "country")
    action, rule, _, _ = decide(c("a", "Mel", "person"), c("b", "Mel's", "place"))
    assert (action, rule) == ("flag", "type_conflict")
    # A possessive of an untyped mention is the person ("Mel's dog"): merged.
    assert decide(c("a", "Mel", "person", 3), c("b", "Mel's", "concept"))[0] == "merge"


def test_a_look_alike_name_is_at_most_flagged() -> None:
    # Caroline / Carolina: even with the same relations and the same contexts, never merged.
    d = decide_pair(c("a", "Caroline", "person", shared_relations=3, context_similarity=0.99),
                    c("b", "Carolina", "person"), context_threshold=0.8)
    assert d.action == "flag" and d.rule == "spelling" and d.score > 0.75
    # Without anything in common besides the spelling: nothing, not even a flag.
    assert decide(c("a", "Caroline", "person"), c("b", "Carolina", "person"))[0] == "none"
    # Close contexts alone (the embedding) never merge different names.
    assert decide(c("a", "Postgres", context_similarity=0.97), c("b", "MySQL"))[0] == "none"


def test_short_name_merges_only_a_person_with_one_fit_and_a_shared_relation() -> None:
    short = c("a", "Caroline", "person", shared_relations=1, longer_names=1)
    assert decide(short, c("b", "Caroline Smith", "concept")) == ("merge", "short_name", "b", "a")
    # Two Carolines with a surname: ambiguous.
    two = c("a", "Caroline", "person", shared_relations=1, longer_names=2)
    assert decide(two, c("b", "Caroline Smith"))[:2] == ("flag", "short_name")
    # No shared relation: at most a flag when the contexts agree, else nothing.
    assert decide(c("a", "Caroline", "person", longer_names=1), c("b", "Caroline Smith"))[0] == "none"
    assert decide(c("a", "Caroline", "person", longer_names=1, context_similarity=0.9),
                  c("b", "Caroline Smith"))[:2] == ("flag", "short_name")
    # Things: "Lisbon" is not "Lisbon office", whatever they share.
    assert decide(c("a", "Lisbon", shared_relations=2, longer_names=1), c("b", "Lisbon Office"))[0] == "flag"
    assert decide(c("a", "PostgreSQL", "technology", shared_relations=2, longer_names=1),
                  c("b", "PostgreSQL 16", "technology"))[0] == "flag"


def test_an_alias_merges_when_one_entity_owns_it() -> None:
    # "Bob" is upserted; "Robert Jones" already carries the alias "Bob".
    assert decide(c("a", "Bob", "person"), c("b", "Robert Jones", "person", alias_of_other=True)) == (
        "merge", "alias", "b", "a")
    assert decide(c("a", "Bob", "person", alias_owners=2),
                  c("b", "Robert Jones", "person", alias_of_other=True, alias_owners=2))[0] == "flag"
    assert decide(c("a", "Bob", "person"), c("b", "Bob Marley Venue", "place", alias_of_other=True))[0] == "none"


def test_a_pair_kept_apart_is_never_merged_again() -> None:
    assert decide(c("a", "Tomás"), c("b", "Tomas"), kept_apart=True)[:2] == ("none", "kept_apart")
