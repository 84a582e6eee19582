"""What happens to a request between the stream's parse and its answer: tokenize → flow-control hold → decide.

The ext_proc stream is pure; when a message completes what the decision reads it returns a `NeedDecision`, and its
adapter runs the pipeline on it before resuming the stream. Each stage is skipped when it is not configured, so the
default path is one synchronous `decide` (`immediate`, no coroutine); otherwise the adapter iterates `run`:

1. tokenize: a vllm token-producer's render call (`epp.director.tokens`, I/O, bounded by its timeout, never
   raises) puts the engine's token ids on the request;
2. hold: flow control (`epp.director.flow.FlowHold.hold`: this process's gate, or a worker's link to the
   control process's) admits the request, refuses it, or keeps it in its
   queue; while it waits, `run` yields the seconds Envoy should keep waiting for an answer (the adapter sends
   those as hold messages), so the stream stays open without an answer;
3. decide: the director's synchronous decision over the endpoint table (`Director.decide`), after which flow
   control learns that the pick is booked (`decided`) and, with eviction on, tracks a sheddable request in
   flight until the stream completes its decision (`complete`).

Before them, with `answer` (--serve-models-list), a request without a body that the picker answers itself
(`GET /v1/models`) gets that `Answer` and skips every stage: it is no inference request.

Whatever a stage refuses or breaks is the outcome (an EppError, or the failure the stream answers as internal);
nothing escapes `run` but cancellation (nor the adapter's call of `immediate`, which catches the same).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from epp.director.decision import Answer, Decided, Decision, NeedDecision, Timing
from epp.director.flow import FlowHold
from epp.director.tokens import RenderTokenizer
from epp.requests import InferenceRequest

QUEUED_S = 0.001  # a wait in flow control's queue shorter than this is a pass-through
DecideFn = Callable[[InferenceRequest, Sequence[str] | None], Decision]
# What the adapter calls when no stage waits: the decision, or the picker's own answer.
ImmediateFn = Callable[[InferenceRequest, Sequence[str] | None], Decision | Answer]
# The picker's own answer to a request, or None: the request is decided as any other.
AnswerFn = Callable[[InferenceRequest], Answer | None]


class CompleteFn(Protocol):
    """The request ended: release its booking; `timing`, what its response cost (None: it did not end normally)."""

    def __call__(self, decision: Decision, timing: Timing | None = None) -> None: ...


class FirstByteFn(Protocol):
    """The response's first byte came: release the prefill booking; `timing`, the stream's timing of it (its TTFT),
    for the observation feed."""

    def __call__(self, decision: Decision, timing: Timing | None = None) -> None: ...


def _no_first_byte(decision: Decision, timing: Timing | None = None) -> None:
    """A pipeline that books no prefill and feeds no learner has nothing to do at the first byte."""


class DecisionPipeline:
    """One instance per director (`Director.pipeline`), shared by every stream; `around` gives the same stages
    over another decide and complete (the tracing director's spans)."""

    __slots__ = (
        "_answer",
        "_clock",
        "_complete",
        "_decide",
        "_gate",
        "_tokenizer",
        "_tracked",
        "complete",
        "first_byte",
        "immediate",
    )

    def __init__(
        self,
        decide: DecideFn,
        complete: CompleteFn,
        clock: Callable[[], float],
        tokenizer: RenderTokenizer | None = None,
        gate: FlowHold | None = None,
        answer: AnswerFn | None = None,
        first_byte: FirstByteFn = _no_first_byte,
    ) -> None:
        self._decide = decide
        # What a stream calls at its response's first byte: the director's `first_byte` (the prefill is done, the
        # TTFT known).
        self.first_byte = first_byte
        self._answer = answer
        self._complete = complete
        self._clock = clock
        self._tokenizer = tokenizer
        self._gate = gate
        self._tracked: dict[int, Any] = {}  # id(decision) → its eviction handle, while in flight
        # The director's decide itself when no stage waits (no render call, no flow control: the default), so the
        # adapter decides at once, with no coroutine and no call in between; None: the adapter iterates `run`.
        self.immediate: ImmediateFn | None = decide if tokenizer is None and gate is None else None
        if answer is not None and self.immediate is not None:
            self.immediate = self._answer_or_decide
        # What a stream calls when it is done with its decision (response ended, refused, evicted or closed): the
        # director's `complete`, which releases the booking; with flow control, also the eviction bookkeeping.
        self.complete: CompleteFn = complete if gate is None else self._complete_tracked

    @property
    def tokenizer(self) -> RenderTokenizer | None:
        return self._tokenizer

    @property
    def gate(self) -> FlowHold | None:
        return self._gate

    def around(self, decide: DecideFn, complete: CompleteFn) -> DecisionPipeline:
        return DecisionPipeline(
            decide, complete, self._clock, self._tokenizer, self._gate, self._answer, self.first_byte
        )

    def answering(self, answer: AnswerFn) -> DecisionPipeline:
        """The same stages, with the picker's own answers first (`answer`: --serve-models-list)."""
        return DecisionPipeline(
            self._decide, self._complete, self._clock, self._tokenizer, self._gate, answer, self.first_byte
        )

    def _answer_or_decide(self, request: InferenceRequest, subset: Sequence[str] | None) -> Decision | Answer:
        if request.no_body:
            assert self._answer is not None
            answer = self._answer(request)
            if answer is not None:
                return answer
        return self._decide(request, subset)

    async def run(
        self, request: NeedDecision, subset: Sequence[str] | None, evict: Callable[[], None] | None = None
    ) -> AsyncIterator[float | Decided]:
        """Every stage for `request`: yields, while flow control holds it, the seconds Envoy should keep waiting,
        and last its outcome (`Decided`). `evict` is how flow control ends the request in flight later (with
        eviction on): the adapter's way to answer the stream 429 at once."""
        tokenizer = self._tokenizer
        gate = self._gate
        started = self._clock()
        if self._answer is not None and request.no_body:
            try:
                answer = self._answer(request)
            except Exception as exc:
                yield Decided(exc, 0.0)
                return
            if answer is not None:
                yield Decided(answer, 0.0)
                return
        try:
            if tokenizer is not None:
                request = await tokenizer.tokenize(request)
            if gate is None:
                waited = self._clock() - started
                yield Decided(self._decide(request, subset), waited)
                return
            held_at = self._clock()
            async with aclosing(gate.hold(request.headers, request.body_size)) as holds:
                async for seconds in holds:
                    yield seconds
            waited = self._clock() - started
            queued = started + waited - held_at
            if queued >= QUEUED_S:  # it really waited: its route receipt says how long (one copy, queued ones only)
                request = request._replace(queued_s=queued)
            try:
                decision = self._decide(request, subset)
            finally:
                gate.decided()
            if evict is not None and gate.evicting:
                handle = gate.track(request.headers, evict)
                if handle is not None:
                    self._tracked[id(decision)] = handle
        except Exception as exc:  # an EppError is a refusal; anything else the stream answers as internal
            yield Decided(exc, self._clock() - started)
            return
        yield Decided(decision, waited)

    def _complete_tracked(self, decision: Decision, timing: Timing | None = None) -> None:
        """`complete` with flow control: release the booking, then, for a request flow control tracked in flight
        (eviction on), confirm that it is gone."""
        self._complete(decision, timing)  # the director wakes flow control: room may have opened for a queued request
        if self._tracked:
            handle = self._tracked.pop(id(decision), None)
            if handle is not None:
                assert self._gate is not None
                self._gate.untrack(handle)
