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
