"""The values that cross between the protocol and the director: what a stream asks to have decided
(`NeedDecision`), where its request goes (`Decision`), the picker's own answer (`Answer`) or why it does not
(`Outcome`).

Pure values, no behaviour: the ext_proc stream (which may do no I/O) hands out the first and reads the others, the
director's pipeline (`epp.director.pipeline`) turns the one into the other.
"""

from __future__ import annotations

from typing import NamedTuple

from epp.datastore.observations import PickFeatures
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
    prefill: int = 0  # uncached prompt tokens booked as prefill on `slot`, released at the first byte (or the end)
    stages: tuple[tuple[int, str], ...] = ()  # the other endpoints booked for it (P/D prefill, E/P/D encode)
    booked: str = ""  # the address booked on `slot` when the destination differs (data parallelism's port)
    response_headers: tuple[tuple[str, str], ...] = ()  # headers the response carries back (session tokens)
    scores: tuple[tuple[str, float], ...] = ()  # --emit-endpoint-scores: (address, weighted score), each scored one
    pick: PickFeatures | None = None  # the primary endpoint as the pick saw it (the observation feed's features)
    receipt: str | None = None  # --emit-route-receipts: the pick's route receipt, JSON (epp.scheduling.receipt)
    # The `envoy.lb` entries of the scores and the receipt as the bytes the answer copies, where the receipt's
    # compiled call wrote them (`epp.extproc.messages.lb_entries_python`'s); `scores` is then () and `receipt` the
    # same JSON, for reading. b"": the answer writes `scores` and `receipt` itself.
    metadata: bytes = b""

    @property
    def header_value(self) -> str:
        return ",".join(self.addresses)


class Timing(NamedTuple):
    """What the response cost, as the stream timed it on its own clock (durations only, so the stream's clock and
    the director's never mix): the observation feed's measured half (`epp.datastore.observations`)."""

    ttft_s: float  # the decision → the first response byte (NaN: none came)
    tpot_s: float  # (last chunk − first chunk) / (output tokens − 1); NaN unless streaming with > 1 token
    output_tokens: int  # -1: the response reported no usage
    streaming: bool
    waited_s: float  # received → decided


# What a stream asks to have decided is the request itself, parsed once: `StreamProcessor.handle` returns it (in
# place of answers) from the message that completes what the decision reads, with the gateway's subset hint beside
# it (`StreamProcessor.subset`) and the body's length on it (`body_size`: flow control's queue accounting). No
# wrapper is built per request (an object's construction costs about as much as the call that decides it).
NeedDecision = InferenceRequest


class Answer(NamedTuple):
    """The picker answers the request itself, 200 with this body (`GET /v1/models` with --serve-models-list):
    nothing is booked, nothing goes to an endpoint."""

    body: bytes
    content_type: str = "application/json"


# What the pipeline hands back for the stream to answer: the decision, the picker's own answer, or the refusal
# (EppError) or failure that stands in for one.
Outcome = Decision | Answer | Exception


class Decided(NamedTuple):
    """The last item `DecisionPipeline.run` yields: the outcome, and the seconds spent on I/O and in the
    flow-control queue (left out of the scheduling latency the stream reports)."""

    outcome: Outcome
    waited_s: float
