"""Typed errors. The server maps each class to an HTTP status once (server/errors.py)."""

from __future__ import annotations


class OsserveError(Exception):
    """Base class of every error osserve raises on purpose."""

    code: str | None = None  # OpenAI's machine-readable error code, where one names the case

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ConfigError(OsserveError):
    """A config.json, preset or engine setting osserve cannot use."""


class CheckpointError(OsserveError):
    """A checkpoint is missing a tensor, or has one of the wrong shape or dtype."""


class TokenizerError(OsserveError):
    """The offline vocabulary is missing or corrupt."""


class InvalidRequestError(OsserveError):
    """A request's fields are out of range or inconsistent (HTTP 400)."""


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens exceed the model's context (HTTP 400)."""

    code = "context_length_exceeded"


class NotFoundError(OsserveError):
    """The request names something this server does not have, such as a stored response (HTTP 404)."""


class ModelNotFoundError(NotFoundError):
    """The request names a model this server does not serve (HTTP 404)."""

    code = "model_not_found"


class OverloadedError(OsserveError):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class EngineDeadError(OsserveError):
    """The engine's step loop failed; requests cannot be served (HTTP 500/503)."""


class ToolSetupError(ConfigError):
    """A tool server cannot be used at start: an unreachable MCP URL, an unknown `--tool-server`
    name, or a python sandbox that cannot be isolated (without the explicit unsafe flag)."""


class ToolServerUnavailableError(OsserveError):
    """A tool server a request names (an allowed MCP `server_url`) cannot be reached (HTTP 424,
    as OpenAI answers when it cannot list an MCP server's tools)."""
