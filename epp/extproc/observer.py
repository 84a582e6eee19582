"""What a stream reports, and to whom: the metrics (`StreamObserver`), the record it fills in for one request
(`RequestRecord`), the rate-limited log of its failures (`Warnings`). Protocols only, so the stream stays pure: the
observability layer implements them (`epp.observability.metrics.PickerMetrics`, `epp.observability.ratelimit`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from epp.errors import ErrorCode


class RequestRecord(Protocol):
    """The fields of `epp.observability.metrics.RequestRecord` the stream writes as the request goes."""

    request_bytes: int
    response_started_at: float
    streaming: bool


Record = TypeVar("Record", bound=RequestRecord)


class StreamObserver(Protocol[Record]):
    """Where a stream reports what happened (the metrics); every method is cheap and never raises.

    `request_started` hands out the stream's record, passed back on every later call so the labels of a request
    are resolved once (`Record`: the observer's own record type, a `RequestRecord`)."""

    def request_started(self, now: float) -> Record: ...

    def decided(
        self,
        record: Record | None,
        started: float,
        now: float,
        model: str,
        target: str,
        fairness_id: str | None,
        objective: str | None,
        address: str,
    ) -> None: ...

    def request_done(
        self,
        code: ErrorCode | None,
        model: str,
        target_model: str,
        record: Record | None = None,
        now: float = 0.0,
        fairness_id: str | None = None,
        objective: str | None = None,
    ) -> None: ...

    def response_chunk(self, record: Record, now: float, size: int) -> None: ...

    def usage(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        record: Record | None = None,
        cached_tokens: int = -1,
    ) -> None: ...

    def usage_invalid(self) -> None: ...

    def served_mismatch(self) -> None: ...

    def stream_refused(self, reason: str) -> None: ...


class Warnings(Protocol):
    """A log that repeats a line at most once per interval (`epp.observability.ratelimit.RateLimitedLog`)."""

    def log(self, key: object, level: int, msg: str, *args: object, exc_info: bool = False) -> bool: ...
