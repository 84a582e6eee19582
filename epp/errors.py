"""One error type that carries a code.

The code picks the HTTP status of the ImmediateResponse Envoy sends to the client, and is the `code` label of the
requests metric, so a failure is visible in the same words to the client, the log and the dashboards.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """Upstream's error codes (GIE `pkg/epp/util/error`), with the HTTP status each one maps to."""

    BAD_REQUEST = ("BadRequest", 400)
    BODY_TOO_LARGE = ("RequestTooLarge", 413)
    PRECONDITION_FAILED = ("PreconditionFailed", 412)  # `Prefer: if-available` and no cached prefix (wire.py)
    SERVICE_UNAVAILABLE = ("ServiceUnavailable", 503)
    RESOURCE_EXHAUSTED = ("ResourceExhausted", 429)
    INTERNAL = ("Internal", 500)

    def __init__(self, label: str, http_status: int) -> None:
        self.label = label
        self.http_status = http_status


class EppError(Exception):
    """A request the picker refuses, with the reason the client will read."""

    def __init__(self, code: ErrorCode, message: str, dropped_reason: str | None = None) -> None:
        """`dropped_reason`: upstream's `x-llm-d-request-dropped-reason` value (e.g. `rejected-saturated`), for the
        refusals upstream gives one for."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.dropped_reason = dropped_reason

    @property
    def body(self) -> str:
        """Upstream's body text, so clients and tests written against upstream read the same thing."""
        return f"inference error: {self.code.label} - {self.message}"

    def __repr__(self) -> str:
        return f"EppError({self.code.name}, {self.message!r})"


class ConfigError(Exception):
    """A flag, file or object the picker cannot start with; the message names the file, field and why."""
