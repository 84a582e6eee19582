"""The two values that cross between the protocol and the director: what a stream asks to have decided
(`NeedDecision`) and where its request goes (`Decision`).

Pure values, no behaviour: the ext_proc stream (which may do no I/O) builds the first and reads the second, the
director's pipeline (`epp.director.pipeline`) fills the one with the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from epp.requests import InferenceRequest


class Decision(NamedTuple):
    """Where a request goes: addresses best first, and the slots booked in flight for it. Immutable; a NamedTuple
    because one is built per request (a frozen dataclass's `__init__` costs about 1 µs more)."""

    addresses: tuple[str, ...]
    slot: int
    degraded: bool = False
    body: bytes | None = None  # a rewritten body, when the decision changed it (model rewrite)
    original_model: str = ""  # the model the client asked for
    target_model: str = ""  # the model the endpoint is asked for (differs after a rewrite)
    site: str | None = None  # a remote federated site took the request (slot is then -1)
    headers: tuple[tuple[str, str], ...] = ()  # request headers the gateway adds before forwarding
    tokens: int = 0  # prompt tokens booked in flight on `slot` (inflight-load-producer), released with it
    stages: tuple[tuple[int, str], ...] = ()  # the other endpoints booked for it (P/D prefill, E/P/D encode)
    booked: str = ""  # the address booked on `slot` when the destination differs (data parallelism's port)
    response_headers: tuple[tuple[str, str], ...] = ()  # headers the response carries back (session tokens)
    scores: tuple[tuple[str, float], ...] = ()  # --emit-endpoint-scores: (address, weighted score), each scored one

    @property
    def header_value(self) -> str:
        return ",".join(self.addresses)


class NeedDecision:
    """A stream's request, parsed once, waiting for its decision: the stream returns it from the message that
    completes what the decision reads, the adapter runs the director's pipeline on it, and the pipeline leaves
    exactly one of `decision` or `error` set before the stream is resumed with it (`StreamProcessor.resume`).

    `size` is the body's length in bytes (flow control's queue accounting); `waited_s` the seconds the pipeline
    spent on I/O and in the flow-control queue, left out of the scheduling latency the stream reports."""

    __slots__ = ("decision", "error", "request", "size", "subset", "waited_s")

    def __init__(self, request: InferenceRequest, subset: Sequence[str] | None, size: int) -> None:
        self.request = request
        self.subset = subset
        self.size = size
        self.decision: Decision | None = None
        self.error: Exception | None = None
        self.waited_s = 0.0
