"""Event contracts: schemas are generated from the models, and bad input gets a precise reason."""

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from shared.bus import Poison, decode_event
from shared.config import Settings
from shared.events import EVENT_MODELS, SessionCompleted
from shared.events.export import render_schemas

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"workspace_id": "w1", "session_id": "s1", "agent_id": "a", "user_id": "u",
        "messages": [{"role": "user", "content": "We chose Postgres.", "created_at": "2026-01-01T10:00:00Z"}],
        "started_at": "2026-01-01T10:00:00Z", "completed_at": "2026-01-01T10:05:00Z", "metadata": {"k": 1}}


def test_schemas_in_repo_match_models() -> None:
    for name, text in render_schemas().items():
        assert (ROOT / "schemas" / name).read_text() == text, f"schemas/{name} is stale: run 'palace schemas'"


def test_every_event_has_a_versioned_schema() -> None:
    for subject, model in EVENT_MODELS.items():
        schema = model.model_json_schema()
        assert "schema_version" in schema["properties"], subject
        Draft202012Validator.check_schema(schema)


def test_good_event_validates_against_schema_and_model() -> None:
    schema = json.loads((ROOT / "schemas" / "session.completed.json").read_text())
    Draft202012Validator(schema).validate(GOOD)
    ev = decode_event(SessionCompleted, json.dumps(GOOD).encode(), Settings())
    assert ev.event_id and ev.schema_version == "1"


def test_event_id_is_derived_deterministically() -> None:
    a = SessionCompleted.model_validate(GOOD)
    b = SessionCompleted.model_validate(GOOD)
    c = SessionCompleted.model_validate({**GOOD, "messages": [{"role": "user", "content": "Other."}]})
    assert a.event_id == b.event_id != c.event_id


def _bad(**changes: object) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


@pytest.mark.parametrize(("payload", "reason"), [
    (b"not json at all", "invalid session.completed"),
    (b"\xff\xfe\x00garbage", "not valid UTF-8"),
    (_bad(messages=[]), "messages"),
    (_bad(session_id=42), "session_id"),
    (_bad(unexpected=True), "unexpected"),
    (_bad(schema_version="9"), "schema_version"),
    (_bad(workspace_id="has space"), "workspace_id"),
    (_bad(messages=[{"role": "robot", "content": "x"}]), "role"),
    (_bad(messages=[{"role": "user", "content": "a\u0000b"}]), "NUL"),
    (_bad(metadata={"k": "a\u0000"}), "NUL"),
    (_bad(messages=[{"role": "user", "content": "ok", "name": "a\u0000"}]), "messages.0.name: text contains NUL"),
    (_bad(metadata={"a\u0000": 1}), "key contains NUL"),
    (_bad(metadata={"k": float("nan")}), "metadata.k: nan is not a finite number"),
    (_bad(messages=[{"role": "user", "content": "ok", "metadata": {"x": [1e999]}}]), "messages.0.metadata.x.0: inf"),
    (b"x" * 2_000_000, "exceeds"),
])
def test_bad_input_is_poison_with_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(Poison) as e:
        decode_event(SessionCompleted, payload, Settings())
    assert reason in str(e.value)


def test_migrations_have_stable_checksums() -> None:
    from shared.db.migrate import load_migrations

    migs = load_migrations()
    assert [m.version for m in migs] == sorted({m.version for m in migs})
    assert all(len(m.checksum) == 16 for m in migs)


def test_configuration_reference_is_generated_from_the_settings() -> None:
    from shared.config import Settings
    from shared.config_doc import CONFIG_DOC, render_configuration

    page = (ROOT / CONFIG_DOC).read_text()
    assert page == render_configuration(), "docs/configuration.md is stale: run 'palace schemas'"
    assert all(f"`PALACE_{n.upper()}`" in page for n in Settings.model_fields)


@pytest.mark.parametrize(("model", "payload"), [
    ("entity.upserted", {"event_id": "e", "workspace_id": "w", "entity_ids": ["a\u0000"], "names": ["n"]}),
    ("episodic.created", {"event_id": "e", "workspace_id": "w", "episode_id": "0" * 32, "session_id": "s",
                          "summary": "a\u0000", "abstract": "a"}),
])
def test_nul_is_rejected_in_every_event(model: str, payload: dict[str, object]) -> None:
    """Any string field may reach SQL as a parameter, and PostgreSQL refuses NUL on every attempt."""
    with pytest.raises(Poison, match="NUL"):
        decode_event(EVENT_MODELS[model], json.dumps(payload).encode(), Settings())  # type: ignore[arg-type]


def test_a_long_message_is_valid_within_the_event_byte_limit() -> None:
    """No per-message character limit: a long turn is chunked; the event's byte limit bounds it."""
    s = Settings()
    ev = {"workspace_id": "w", "session_id": "s", "messages": [{"role": "user", "content": "long. " * 40_000}]}
    assert len(decode_event(SessionCompleted, json.dumps(ev).encode(), s).messages[0].content) == 240_000
    too_big = {**ev, "messages": [{"role": "user", "content": "y" * s.max_event_bytes}]}
    with pytest.raises(Poison, match="exceeds"):
        decode_event(SessionCompleted, json.dumps(too_big).encode(), s)


def test_a_turn_dated_where_the_database_could_not_read_it_back_is_invalid() -> None:
    """Dead-lettered once as invalid, not stored and then failing every read of its drawers."""
    from pydantic import ValidationError

    turn = {"role": "user", "content": "hi", "created_at": "9999-12-31T23:30:00-01:00"}
    with pytest.raises(ValidationError, match="outside the years"):
        SessionCompleted(workspace_id="w", session_id="s", messages=[turn])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="outside the years"):
        SessionCompleted(workspace_id="w", session_id="s", started_at="0001-01-01T00:00:00+01:00",  # type: ignore[arg-type]
                         messages=[{**turn, "created_at": None}])  # type: ignore[list-item]
