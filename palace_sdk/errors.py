"""The SDK's exceptions: one class per kind of refusal, so a caller catches what it can act on.

The API answers errors as JSON, ``{"detail": ...}`` and, from servers that send it, a stable
``"error"`` code; the status decides the class here and both travel on the exception.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = [
    "BadRequest",
    "Conflict",
    "EventInvalid",
    "Forbidden",
    "InvalidRequest",
    "NatsUnreachable",
    "NotFound",
    "PalaceAPIError",
    "PalaceError",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "Unauthorized",
    "error_for",
]


class PalaceError(Exception):
    """Anything the SDK raises on purpose."""


class NatsUnreachable(PalaceError, ConnectionError):
    """No NATS server of ``nats_url`` answered within the client's timeout: nothing was published."""


class EventInvalid(PalaceError, ValueError):
    """An event refused before it was sent: it does not match the ``session.completed`` schema, or it is
    over the size the pipeline accepts. Nothing was published."""


class PalaceAPIError(PalaceError):
    """The API refused a request. ``status`` is the HTTP status, ``code`` a stable name for it
    (``not_found``, ``rate_limited``, ...), ``detail`` the server's reason (for 422, the invalid fields)."""

    status: int = 0
    code: str = "error"

    def __init__(self, status: int, detail: Any, code: str | None = None, *, response: httpx.Response | None = None):
        self.status = status
        self.detail = detail
        self.code = code or type(self).code
        self.response = response
        super().__init__(f"{status} {self.code}: {detail}")


class BadRequest(PalaceAPIError):
    code = "bad_request"


class Unauthorized(PalaceAPIError):
    """No API key, or one the server does not know (or revoked)."""

    code = "unauthorized"


class Forbidden(PalaceAPIError):
    """The key belongs to another workspace."""

    code = "forbidden"


class NotFound(PalaceAPIError):
    code = "not_found"


class Conflict(PalaceAPIError):
    code = "conflict"


class PayloadTooLarge(PalaceAPIError):
    code = "payload_too_large"


class InvalidRequest(PalaceAPIError, ValueError):
    """A field is invalid; ``detail`` says which and why."""

    code = "invalid_request"


class RateLimited(PalaceAPIError):
    """Over the key's rate limit; ``retry_after`` is the server's advice in seconds, when it gave one."""

    code = "rate_limited"

    @property
    def retry_after(self) -> float | None:
        value = self.response.headers.get("retry-after") if self.response is not None else None
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


class ServerError(PalaceAPIError):
    code = "internal_error"


_BY_STATUS: dict[int, type[PalaceAPIError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: PayloadTooLarge,
    422: InvalidRequest, 429: RateLimited,
}


def error_for(response: httpx.Response) -> PalaceAPIError:
    """The exception for an error answer, with the server's JSON reason (or its text when not JSON)."""
    detail: Any
    code = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        detail, code = body["detail"], body.get("error")
    else:
        detail = response.text or response.reason_phrase
    cls = _BY_STATUS.get(response.status_code) or (ServerError if response.status_code >= 500 else PalaceAPIError)
    return cls(response.status_code, detail, code if isinstance(code, str) else None, response=response)
