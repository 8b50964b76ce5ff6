"""Typed errors → HTTP status and OpenAI's error body, mapped once for the whole app."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from osserve.errors import (
    ContextLengthError,
    EngineDeadError,
    InvalidRequestError,
    ModelNotFoundError,
    OsserveError,
    OverloadedError,
)

STATUS: list[tuple[type[OsserveError], int, str]] = [
    (ContextLengthError, 400, "invalid_request_error"),
    (InvalidRequestError, 400, "invalid_request_error"),
    (ModelNotFoundError, 404, "not_found_error"),
    (OverloadedError, 503, "overloaded_error"),
    (EngineDeadError, 503, "engine_error"),
]


class AuthError(OsserveError):
    """Missing or wrong API key (401)."""


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, status), status_code=status, headers=headers)


def status_of(exc: OsserveError) -> tuple[int, str]:
    if isinstance(exc, AuthError):
        return 401, "authentication_error"
    for cls, status, type_ in STATUS:
        if isinstance(exc, cls):
            return status, type_
    return 500, "internal_error"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OsserveError)
    async def _typed(_: Request, exc: OsserveError) -> JSONResponse:
        status, type_ = status_of(exc)
        headers = {"Retry-After": "1"} if isinstance(exc, OverloadedError) else None
        return error_response(status, exc.message, type_, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", "invalid_request_error")
        msg = first.get("msg", "invalid request")
        return error_response(400, f"{param}: {msg}" if param else msg, "invalid_request_error", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")
