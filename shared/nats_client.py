"""Direct NATS connections (the CLI, dead letters, forget's stream purge) with the same credentials and
TLS as the services' broker: a secured NATS refused every connection made without them, so a forget
wrote its tombstones and audit row and then failed before purging the streams."""

from __future__ import annotations

import ssl
from typing import Any

import nats

from shared.config import Settings

__all__ = ["connect", "nats_options"]


def nats_options(settings: Settings) -> dict[str, Any]:
    """nats-py's connection options for PALACE_NATS_USER/PASSWORD, _TOKEN, _CREDS and _TLS_CA."""
    opts: dict[str, Any] = {}
    if settings.nats_user:
        opts["user"] = settings.nats_user
        opts["password"] = settings.nats_password
    if settings.nats_token:
        opts["token"] = settings.nats_token
    if settings.nats_creds:
        opts["user_credentials"] = settings.nats_creds
    if settings.nats_tls_ca:
        opts["tls"] = ssl.create_default_context(cafile=settings.nats_tls_ca)
    return opts


async def connect(settings: Settings, nats_url: str, **kwargs: Any) -> nats.NATS:
    """``nats.connect`` to ``nats_url`` (comma-separated servers) with the configured credentials."""
    return await nats.connect(nats_url.split(","), **nats_options(settings), **kwargs)
