"""Deterministic ids: the same input always gives the same key; different inputs never collide."""

from shared.ids import content_hash, drawer_id, normalize_content, stable_id


def test_content_hash_ignores_whitespace_noise() -> None:
    assert content_hash("We chose  Postgres.\n") == content_hash("We chose Postgres.")
    assert content_hash("We chose Postgres.") != content_hash("we chose postgres.")


def test_nfc_normalisation() -> None:
    assert normalize_content("Tomás") == normalize_content("Toma\u0301s")


def test_drawer_id_is_workspace_scoped_and_stable() -> None:
    h = content_hash("x")
    assert drawer_id("w1", h) == drawer_id("w1", h)
    assert drawer_id("w1", h) != drawer_id("w2", h)
    assert len(drawer_id("w1", h)) == 32


def test_stable_id_is_unambiguous() -> None:
    assert stable_id("a", "bc") != stable_id("ab", "c")


def test_a_dead_letter_gets_the_event_id_ingest_derives() -> None:
    """One derivation: the model (ingest) and a dead letter of a payload without an id agree."""
    from shared.events import SessionCompleted, payload_ids

    ev = {"workspace_id": "acme", "session_id": "chat-42",
          "messages": [{"role": "user", "content": "We chose Postgres."}, {"role": "assistant", "content": "Noted."}]}
    derived = SessionCompleted.model_validate(ev).event_id
    assert payload_ids(ev) == (derived, "chat-42")
    assert payload_ids({**ev, "surprise": 1}) == (derived, "chat-42"), "other faults do not change the id"
    assert payload_ids({**ev, "event_id": "mine"}) == ("mine", "chat-42")
    assert payload_ids({**ev, "messages": [{"role": "user", "content": 5}]}) == (None, "chat-42")
    assert payload_ids({**ev, "session_id": 17}) == (None, "17")
    assert payload_ids({**ev, "session_id": True}) == (None, None)
    assert payload_ids([ev]) == (None, None)
