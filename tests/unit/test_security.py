"""API keys: well-formed, stored as hashes, compared in constant time."""

from shared.security import generate_key, hash_key, key_id_of, keys_match


def test_keys_are_unique_and_well_formed() -> None:
    (id1, k1), (id2, k2) = generate_key(), generate_key()
    assert k1 != k2 and id1 != id2
    assert key_id_of(k1) == id1 and k1.startswith(f"pk_{id1}_")


def test_hash_is_not_the_key_and_matches_only_itself() -> None:
    _, k = generate_key()
    h = hash_key(k)
    assert k not in h and len(h) == 64
    assert keys_match(k, h)
    assert not keys_match(k + "x", h)


def test_malformed_keys_have_no_id() -> None:
    for bad in ["", "pk_", "pk_short_x", "sk_0123456789ab_" + "a" * 40, "pk_0123456789ab_tooshort"]:
        assert key_id_of(bad) is None
