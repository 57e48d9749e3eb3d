"""Every error the API returns has one JSON shape: ``{"error": <code>, "detail": <reason>}``.

``error`` is a stable, machine-readable code a client can branch on; ``detail`` says what was wrong in
words (for 422, the list of validation errors with where each one is). FastAPI's defaults answer
``{"detail": ...}`` only, and a body that is not JSON at all gets 422 like a well-formed but invalid
one; here it gets 400, which is what a client should fix first.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.logging import get_logger

__all__ = ["ERROR_CODES", "ERROR_RESPONSES", "ErrorBody", "error_body", "error_response", "install_error_handlers"]

log = get_logger("palace.api")

RETRY_AFTER_S = 5  # what a 503 asks a client to wait before trying again

ERROR_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


class ErrorBody(BaseModel):
    """The body of every error answer."""

    error: str = Field(description="Stable code: bad_request, unauthorized, forbidden, not_found, conflict, "
                       "payload_too_large, invalid_request, rate_limited, internal_error, unavailable.")
    detail: Any = Field(description="What was wrong, in words; for invalid_request, the list of invalid fields.")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not valid JSON."},
    401: {"model": ErrorBody, "description": "Authentication is on and the bearer key is missing, unknown or revoked."},
    403: {"model": ErrorBody, "description": "The key belongs to another workspace."},
    413: {"model": ErrorBody, "description": "The body is over PALACE_MAX_REQUEST_BYTES."},
    422: {"model": ErrorBody, "description": "A field is invalid; `detail` lists each one with its location."},
    429: {"model": ErrorBody, "description": "Over the rate limit; retry after the Retry-After header's seconds."},
    503: {"model": ErrorBody, "description": "The database or NATS is unreachable or overloaded; retry after the "
          "Retry-After header's seconds."},
}
"""For routers' ``responses=``: documents the error shape in OpenAPI."""


def error_body(status: int, detail: Any) -> dict[str, Any]:
    code = ERROR_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_")
    return {"error": code, "detail": detail}


def error_response(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(jsonable_encoder(error_body(status, detail)), status_code=status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail: Any = exc.detail
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such resource: {request.method} {request.url.path}"
    elif exc.status_code == 413 and detail == "Content Too Large":
        detail = f"request body over {request.app.state.settings.max_request_bytes} bytes"
    return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "the request body is not valid JSON: " + "; ".join(
            str(e.get("ctx", {}).get("error", e.get("msg"))) for e in errors if e.get("type") == "json_invalid"))
    # Inputs are echoed back by pydantic; a rejected secret or a large body should not be.
    return error_response(422, [{k: v for k, v in e.items() if k not in ("input", "url")} for e in errors])


async def _too_large(request: Request, exc: Exception) -> JSONResponse:
    return error_response(413, str(exc))


async def _operation_refused(request: Request, exc: Exception) -> JSONResponse:
    """What ``shared.palace_ops`` refuses, wherever a route lets it through: the same status everywhere."""
    from shared.palace_ops import AmbiguousReference, DrawerNotFound

    status = 404 if isinstance(exc, DrawerNotFound) else 409 if isinstance(exc, AmbiguousReference) else 422
    return error_response(status, str(exc))


async def _data_error(request: Request, exc: Exception) -> JSONResponse:
    """A value PostgreSQL cannot hold reached a statement: text with U+0000 (psycopg refuses to send it) is
    the caller's input, whichever field carried it; any other data error is ours."""
    if "NUL" in str(exc):
        return error_response(422, "a text field contains NUL (U+0000), which PostgreSQL cannot store")
    return await _unhandled(request, exc)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    from shared.faults import is_transient

    if is_transient(exc):
        # The database or NATS unreachable, saturated (the pool's wait ran out) or past a statement timeout:
        # nothing is wrong with the request, and the same request may succeed in a moment.
        log.warning("api_dependency_unavailable", method=request.method, path=request.url.path,
                    error=repr(exc)[:300], exc_info=exc)
        return error_response(503, f"a dependency is unavailable or overloaded ({type(exc).__name__}); retry shortly",
                              headers={"Retry-After": str(RETRY_AFTER_S)})
    log.error("api_unhandled_error", method=request.method, path=request.url.path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    import psycopg

    from shared.bus import EventTooLarge
    from shared.palace_ops import OperationError

    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(EventTooLarge, _too_large)
    app.add_exception_handler(OperationError, _operation_refused)
    app.add_exception_handler(psycopg.DataError, _data_error)
    app.add_exception_handler(Exception, _unhandled)
