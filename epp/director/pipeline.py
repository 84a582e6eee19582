"""What happens to a request between the stream's parse and its answer: tokenize → flow-control hold → decide.

The ext_proc stream is pure; when a message completes what the decision reads it returns a `NeedDecision`, and its
adapter runs the pipeline on it before resuming the stream. Each stage is skipped when it is not configured, so the
default path is one synchronous `decide` (`decide_now`, no coroutine); otherwise the adapter iterates `run`:

1. tokenize: a vllm token-producer's render call (`epp.director.tokens`, I/O, bounded by its timeout, never
   raises) puts the engine's token ids on the request;
2. hold: flow control (`epp.director.flow.FlowHold.hold`: this process's gate, or a worker's link to the
   control process's) admits the request, refuses it, or keeps it in its
   queue; while it waits, `run` yields the seconds Envoy should keep waiting for an answer (the adapter sends
   those as hold messages), so the stream stays open without an answer;
3. decide: the director's synchronous decision over the endpoint table (`Director.decide`), after which flow
   control learns that the pick is booked (`decided`) and, with eviction on, tracks a sheddable request in
   flight until the stream completes its decision (`complete`).

Whatever a stage refuses or breaks lands in `NeedDecision.error`; nothing escapes `run` but cancellation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from epp.director.decision import Decision, NeedDecision
from epp.director.flow import FlowHold
from epp.director.tokens import RenderTokenizer
from epp.requests import InferenceRequest

DecideFn = Callable[[InferenceRequest, Sequence[str] | None], Decision]
CompleteFn = Callable[[Decision], None]


class DecisionPipeline:
    """One instance per director (`Director.pipeline`), shared by every stream; `around` gives the same stages
    over another decide and complete (the tracing director's spans)."""

    __slots__ = ("_clock", "_complete", "_decide", "_gate", "_tokenizer", "_tracked", "_waits", "complete")

    def __init__(
        self,
        decide: DecideFn,
        complete: CompleteFn,
        clock: Callable[[], float],
        tokenizer: RenderTokenizer | None = None,
        gate: FlowHold | None = None,
    ) -> None:
        self._decide = decide
        self._complete = complete
        self._clock = clock
        self._tokenizer = tokenizer
        self._gate = gate
        self._tracked: dict[int, Any] = {}  # id(decision) → its eviction handle, while in flight
        self._waits = tokenizer is not None or gate is not None
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
        return DecisionPipeline(decide, complete, self._clock, self._tokenizer, self._gate)

    def decide_now(self, need: NeedDecision) -> bool:
        """With no stage that waits (no render call, no flow control: the default), decide `need` at once and
        say True; else False: the caller runs `run`, which has something to await."""
        if self._waits:
            return False
        try:
            need.decision = self._decide(need.request, need.subset)
        except Exception as exc:  # an EppError is a refusal; anything else the stream answers as internal
            need.error = exc
        return True

    async def run(self, need: NeedDecision, evict: Callable[[], None] | None = None) -> AsyncIterator[float]:
        """Decide `need`, leaving its `decision` or its `error` set. Yields, while flow control holds the request,
        the seconds Envoy should keep waiting. `evict` is how flow control ends the request in flight later (with
        eviction on): the adapter's way to answer the stream 429 at once."""
        tokenizer = self._tokenizer
        gate = self._gate
        try:
            if tokenizer is None and gate is None:  # the default path: nothing to wait for
                need.decision = self._decide(need.request, need.subset)
                return
            started = self._clock()
            request = need.request
            if tokenizer is not None:
                request = await tokenizer.tokenize(request)
            if gate is None:
                need.waited_s = self._clock() - started
                need.decision = self._decide(request, need.subset)
                return
            async with aclosing(gate.hold(request.headers, need.size)) as holds:
                async for seconds in holds:
                    yield seconds
            need.waited_s = self._clock() - started
            try:
                decision = need.decision = self._decide(request, need.subset)
            finally:
                gate.decided()
            if evict is not None and gate.evicting:
                handle = gate.track(request.headers, evict)
                if handle is not None:
                    self._tracked[id(decision)] = handle
        except Exception as exc:  # an EppError is a refusal; anything else the stream answers as internal
            need.error = exc

    def _complete_tracked(self, decision: Decision) -> None:
        """`complete` with flow control: release the booking, then, for a request flow control tracked in flight
        (eviction on), confirm that it is gone."""
        self._complete(decision)  # the director wakes flow control: room may have opened for a queued request
        if self._tracked:
            handle = self._tracked.pop(id(decision), None)
            if handle is not None:
                assert self._gate is not None
                self._gate.untrack(handle)
