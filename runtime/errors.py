"""The exception tree every actor and route shares.

    ServingError
    ├── InvalidRequest(message, param)   a client error found after decoding (HTTP 400)
    ├── ModelNotFound(model)             unknown `model` (HTTP 404)
    ├── Overloaded(retry_after)          admission refused (HTTP 429/503 + Retry-After)
    ├── EngineDead                       the executor or an actor died (HTTP 503)
    └── RequestFailed(message)           this request failed inside the engine (HTTP 500)
    ModelRefused(message)                a model found at load not to be served right: the
                                         start fails in one line, exit 2 (api/process/main.py)

Imports nothing but the standard library.
"""

from __future__ import annotations


class ServingError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None
    param: str | None = None


class InvalidRequest(ServingError):
    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ModelNotFound(ServingError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"
    param = "model"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {model!r} does not exist.")


class Overloaded(ServingError):
    status = 429
    type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str = "The server is at capacity; retry shortly.", retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineDead(ServingError):
    status = 503
    type = "server_error"
    code = "engine_unavailable"

    def __init__(self, message: str = "The engine is not running.") -> None:
        super().__init__(message)


class RequestFailed(ServingError):
    status = 500
    type = "server_error"
    code = "request_failed"

    def __init__(self, message: str, usage: object = None) -> None:
        super().__init__(message)
        self.usage = usage  # runtime.messages.Usage, where the engine counted the tokens so far


class ModelRefused(ValueError):
    """A model that would be served wrong, found while it loads (not a request's error)."""
