"""API keys: shown once, stored only as SHA-256 hashes, compared in constant time.

A key looks like ``pk_<key id>_<secret>``; the key id is public (it names the key in listings and
logs), the secret never leaves the caller. 32 random bytes make a brute-force search hopeless, so a
fast hash is enough (no password-style KDF needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["generate_key", "hash_key", "key_id_of", "keys_match"]


def generate_key() -> tuple[str, str]:
    """(key id, full key). Store ``hash_key(full)``; give the full key to the user once."""
    key_id = secrets.token_hex(6)
    return key_id, f"pk_{key_id}_{secrets.token_urlsafe(32)}"


def hash_key(full_key: str) -> str:
    return hashlib.sha256(full_key.encode("utf-8")).hexdigest()


def key_id_of(full_key: str) -> str | None:
    """The key id of a well-formed key, else None (malformed keys are rejected before any lookup)."""
    parts = full_key.split("_", 2)
    if len(parts) != 3 or parts[0] != "pk" or len(parts[1]) != 12 or len(parts[2]) < 32:
        return None
    return parts[1]


def keys_match(full_key: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented key with a stored hash."""
    return hmac.compare_digest(hash_key(full_key), stored_hash)
