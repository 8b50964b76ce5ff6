"""Typed errors → HTTP status and OpenAI's error body, mapped once for the whole app.

The body is OpenAI's: `{"error": {"message", "type", "param", "code"}}`, where `code` is a string that
names the case (`model_not_found`, `context_length_exceeded`, `invalid_api_key`, ...) or null, never
the HTTP status, and `param` names the field as OpenAI writes it (`messages[0].content[1]`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from osserve.errors import (
    EngineDeadError,
    InvalidRequestError,
    NotFoundError,
    OsserveError,
    OverloadedError,
    ToolServerUnavailableError,
)

STATUS: list[tuple[type[OsserveError], int, str]] = [
    (InvalidRequestError, 400, "invalid_request_error"),
    (NotFoundError, 404, "not_found_error"),
    (OverloadedError, 503, "overloaded_error"),
    (EngineDeadError, 503, "engine_error"),
    (ToolServerUnavailableError, 424, "external_connector_error"),
]


class AuthError(OsserveError):
    """Missing or wrong API key (401)."""

    code = "invalid_api_key"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def status_of(exc: OsserveError) -> tuple[int, str]:
    if isinstance(exc, AuthError):
        return 401, "authentication_error"
    for cls, status, type_ in STATUS:
        if isinstance(exc, cls):
            return status, type_
    return 500, "internal_error"


def param_path(loc: Sequence[int | str]) -> str | None:
    """A pydantic error location as OpenAI names a parameter: ("messages", 0, "role") -> messages[0].role."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def validation_code(pydantic_type: str) -> str:
    """OpenAI's code for a field pydantic refused: missing, of the wrong type, or out of range."""
    if pydantic_type == "missing":
        return "missing_required_parameter"
    if pydantic_type.endswith(("_type", "_parsing")):
        return "invalid_type"
    return "invalid_value"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OsserveError)
    async def _typed(_: Request, exc: OsserveError) -> JSONResponse:
        status, type_ = status_of(exc)
        headers = {"Retry-After": "1"} if isinstance(exc, OverloadedError) else None
        return error_response(status, exc.message, type_, exc.param, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = param_path([p for p in first.get("loc", ()) if p != "body"])
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", "invalid_request_error")
        msg = first.get("msg", "invalid request")
        return error_response(400, f"{param}: {msg}" if param else msg, "invalid_request_error", param,
                              validation_code(first.get("type", "")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:  # no such route: OpenAI names the URL
            return error_response(404, f"Invalid URL ({request.method} {request.url.path})",
                                  "invalid_request_error", code="unknown_url")
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")
