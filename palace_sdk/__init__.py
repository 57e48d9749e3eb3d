"""Palace's Python SDK: ``PalaceClient`` (blocking) and ``AsyncPalaceClient`` (asyncio).

It needs only httpx, nats-py and Palace's event models (``shared.events``), never the services::

    from palace_sdk import PalaceClient

    with PalaceClient("acme", "http://127.0.0.1:8080", api_key=KEY, nats_url="nats://127.0.0.1:4222") as palace:
        palace.publish_session({"workspace_id": "acme", "session_id": "chat-1", "messages": [...]})
        for hit in palace.search("Which database for Orion?", k=3).hits:
            print(hit.score, hit.citation, hit.content)
"""

from palace_sdk.client import AsyncPalaceClient, PalaceClient
from palace_sdk.errors import (
    BadRequest,
    Conflict,
    EventInvalid,
    Forbidden,
    InvalidRequest,
    NatsUnreachable,
    NotFound,
    PalaceAPIError,
    PalaceError,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
)
from palace_sdk.models import *  # noqa: F403
from palace_sdk.models import __all__ as _models
from shared.events.models import Message, SessionCompleted

__all__ = [
    "AsyncPalaceClient",
    "BadRequest",
    "Conflict",
    "EventInvalid",
    "Forbidden",
    "InvalidRequest",
    "Message",
    "NatsUnreachable",
    "NotFound",
    "PalaceAPIError",
    "PalaceClient",
    "PalaceError",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "SessionCompleted",
    "Unauthorized",
    *_models,
]
