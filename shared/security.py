"""API keys: shown once, stored only as SHA-256 hashes, compared in constant time.

A key looks like ``pk_<key id>_<secret>``; the key id is public (it names the key in listings and
logs), the secret never leaves the caller. 32 random bytes make a brute-force search hopeless, so a
fast hash is enough (no password-style KDF needed).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets

__all__ = [
    "BOOTSTRAP_KEYS_SETTING",
    "OPEN_BIND_SETTING",
    "generate_key",
    "hash_key",
    "is_loopback_host",
    "key_id_of",
    "keys_match",
    "parse_bootstrap_keys",
    "unsafe_bind_reason",
]

OPEN_BIND_SETTING = "PALACE_API_ALLOW_UNAUTHENTICATED_BIND"
BOOTSTRAP_KEYS_SETTING = "PALACE_API_BOOTSTRAP_KEYS"
_WORKSPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


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



def is_loopback_host(host: str) -> bool:
    """True only for addresses no other machine can reach: 127.0.0.0/8, ::1 (also IPv4-mapped) and
    ``localhost``. Any other name may resolve to a routable address, so it counts as exposed."""
    h = host.strip().strip("[]").lower()
    if h in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def unsafe_bind_reason(host: str, auth: bool, allow_unauthenticated: bool) -> str | None:
    """Why listening on ``host`` would expose every workspace, or None when it is safe.

    Without authentication any caller can read and write any workspace, so that is only acceptable
    where no other machine can connect, or where an operator has explicitly vouched for the network.
    """
    if auth or allow_unauthenticated or is_loopback_host(host):
        return None
    return (
        f"refusing to listen on {host or 'all interfaces'!s} with authentication off: any caller could read and "
        "write every workspace. Set PALACE_API_AUTH=true (keys: `palace apikey create` or "
        f"{BOOTSTRAP_KEYS_SETTING}), or listen on loopback (PALACE_API_HOST=127.0.0.1), or, only on a network "
        f"you trust, set {OPEN_BIND_SETTING}=true."
    )


def parse_bootstrap_keys(text: str) -> list[tuple[str, str]]:
    """``ws=key,ws2=key2`` → [(workspace id, full key)], validated.

    Errors name the entry by position and workspace, never the key: the value is a secret and error
    messages end up in logs.
    """
    pairs: list[tuple[str, str]] = []
    for n, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        workspace, sep, key = (p.strip() for p in entry.partition("="))
        if not sep or not workspace or not key:
            raise ValueError(f"{BOOTSTRAP_KEYS_SETTING} entry {n}: expected workspace_id=key")
        if not _WORKSPACE.match(workspace):
            raise ValueError(f"{BOOTSTRAP_KEYS_SETTING} entry {n}: invalid workspace id {workspace!r}")
        if key_id_of(key) is None:
            raise ValueError(
                f"{BOOTSTRAP_KEYS_SETTING} entry {n} ({workspace}): the key is not of the form "
                "pk_<12 hex>_<32+ characters> (make one with `palace apikey generate`)"
            )
        pairs.append((workspace, key))
    return pairs
