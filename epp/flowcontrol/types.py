"""Outcomes of a queued request and what each one means on the wire (upstream's `flowcontrol/types/outcomes.go`
and the reason values of `x-llm-d-request-dropped-reason`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Outcome(enum.Enum):
    """How a request left the queue; the value is the `outcome` label of the flow-control metrics."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_CANCELLED = "EvictedContextCancelled"
    REJECTED_SHUTDOWN = "RejectedShuttingDown"
    REJECTED_ADMISSION = "RejectedAdmission"

    @property
    def status(self) -> int:
        return _STATUS[self]

    @property
    def reason(self) -> str:
        return _REASON[self]


_STATUS = {
    Outcome.DISPATCHED: 200,
    Outcome.REJECTED_CAPACITY: 429,
    Outcome.REJECTED_NO_ENDPOINTS: 503,
    Outcome.EVICTED_TTL: 429,
    Outcome.EVICTED_CANCELLED: 503,
    Outcome.REJECTED_SHUTDOWN: 503,
    Outcome.REJECTED_ADMISSION: 429,
}
_REASON = {
    Outcome.DISPATCHED: "",
    Outcome.REJECTED_CAPACITY: "rejected-saturated",
    Outcome.REJECTED_NO_ENDPOINTS: "rejected-no-endpoints",
    Outcome.EVICTED_TTL: "rejected-ttl-expired",
    Outcome.EVICTED_CANCELLED: "rejected-context-cancelled",
    Outcome.REJECTED_SHUTDOWN: "rejected-shutting-down",
    Outcome.REJECTED_ADMISSION: "rejected-saturated",
}

DEFAULT_FLOW = "default-flow"  # upstream's fairness id when the request names none


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """One request waiting for dispatch. `ticket` is whatever the caller uses to wake the waiter (an asyncio
    Future on the serving path, a simulated request in the benchmark); the queue never looks inside it."""

    ticket: object
    flow_id: str = DEFAULT_FLOW
    priority: int = 0
    size: int = 0  # bytes counted against the byte caps (the request body)
    received_at: float = 0.0
    slo_ttft_s: float | None = None  # x-llm-d-slo-ttft-ms, in seconds
    ttl_s: float | None = None  # None: the controller's default TTL
    seq: int = 0  # arrival order, set by the controller
    enqueued_at: float = 0.0
    budget_from: float = 0.0  # start of the current TTL regime (pool with endpoints / empty pool)
    alive: bool = field(default=True)

    @property
    def slo_deadline(self) -> float:
        return self.received_at + self.slo_ttft_s if self.slo_ttft_s is not None else float("inf")
