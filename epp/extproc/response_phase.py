"""An ext_proc stream from its decision on, as a base of `StreamProcessor`: `resume` with the decision, then the
response's transitions.

`resume` answers with the pipeline's outcome: the answer that carries the decision, with whatever the deciding
message held back (or the ImmediateResponse of a refusal). Then the request went on: the stream reads the
response's usage in the dialect of the request's parser, puts a rewritten model name back, echoes the headers a
plugin asked for, and ends the request (its booking released, counted) when the response ends. A failure of ours
here never breaks a good response: the message is answered unchanged (`_unchanged`). Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from epp import wire
from epp.director.decision import Answer, Decision, Outcome, Timing
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.extproc.observer import StreamObserver
from epp.extproc.phases import Phase
from epp.extproc.response import ResponseTracker, Usage, model_restorer
from epp.requests import InferenceRequest, UsageDialect

_DECIDING, _RESPONSE_BODY, _RESPONSE_DONE = Phase.DECIDING, Phase.RESPONSE_BODY, Phase.RESPONSE_DONE
_FINISHED = Phase.FINISHED
FULL_DUPLEX = m.FULL_DUPLEX
NONE = m.NONE

_Answers = list[m.ProcessingResponse]

# What the decision's answers are (`StreamProcessor._then`): the decision on the headers answer alone; on the
# buffered body's answer; on the headers answer followed by the body streamed back (FULL_DUPLEX); on the headers
# answer followed by one answer per held chunk (STREAMED with early body).
ON_HEADERS, ON_BODY, DUPLEX, HELD_CHUNKS = range(4)
_NAN = float("nan")
Then = tuple[int, bytes | None, Phase, bool]  # what to answer, the body, the phase after, trailers to answer too


class Bookings(Protocol):
    """Who releases a decision's booking when its request ends (the director's pipeline on the serving path)."""

    def complete(self, decision: Decision, timing: Timing | None = None) -> None: ...

    def first_byte(self, decision: Decision, timing: Timing | None = None) -> None: ...


class ResponsePhases:
    """The response transitions and the request's ending; the state lives in `StreamProcessor`'s slots."""

    __slots__ = (
        "_decided_at",
        "_decision",
        "_held_chunks",
        "_response",
        "_response_body_mode",
        "_rewrite",
        "_started",
        "_then",
        "_usage",
        "phase",
    )

    _answers: m.DecisionAnswers
    _bookings: Bookings
    _generated_id: str
    _started: float
    _decided_at: float  # the stream's clock when the decision came back
    _then: Then
    phase: Phase
    _request: InferenceRequest | None
    _held_chunks: int
    _observer: StreamObserver[Any]
    _clock: Any
    _decision: Decision | None
    _record: Any
    _response: ResponseTracker | None
    _response_body_mode: int
    _rewrite: tuple[bytes, bytes] | None
    _usage: UsageDialect

    def resume(self, outcome: Outcome | None, waited_s: float = 0.0) -> _Answers:
        """The answers that were waiting for the decision: the pipeline's outcome (the decision, or the refusal or
        failure that stands in for one; `waited_s`, its time on I/O and in the queue). Never raises."""
        if self.phase is not _DECIDING:  # the stream ended meanwhile (or never asked): keep no booking
            if outcome.__class__ is Decision:
                self._bookings.complete(outcome)
            return []
        try:
            if outcome.__class__ is not Decision:
                if outcome.__class__ is Answer:
                    return [self._answer(outcome)]
                if isinstance(outcome, Exception):
                    raise outcome
                raise RuntimeError("the decision pipeline gave no outcome")
            decision: Decision = outcome
            self._decision = decision
            request = self._request  # set with `_then` when the stream asked
            self._decided_at = decided_at = self._clock()
            self._observer.decided(
                self._record,
                self._started + waited_s,  # the scheduling latency leaves out the render call and the queue
                decided_at,
                decision.original_model,
                decision.target_model,
                request.fairness_id,  # type: ignore[union-attr]
                request.objective,  # type: ignore[union-attr]
                decision.addresses[0] if decision.addresses else "",
            )
            how, body, next_phase, trailers = self._then  # set in the DECIDING phase
            # The answer that carries the decision: on the headers, or (BUFFERED) on the body.
            new_body = decision.body  # a rewritten body, or None
            destination = ",".join(decision.addresses)  # `header_value`, without a property's call
            set_headers: tuple[tuple[str, str], ...] = ((wire.DESTINATION_HEADER, destination), *decision.headers)
            generated = self._generated_id
            if generated:
                set_headers = (("x-request-id", generated), *set_headers)
            if new_body is not None:
                set_headers = (*set_headers, ("content-length", str(len(new_body))))
            if decision.target_model and decision.target_model != decision.original_model:
                self._rewrite = model_restorer(decision.target_model, decision.original_model)
            on_body = how == ON_BODY
            cacheable = not generated and new_body is None  # a fresh request id or body length is one request's
            answer = self._answers.decision(
                "body" if on_body else "headers",
                set_headers,
                destination,
                new_body if on_body else None,
                cacheable,
                decision.scores,
                decision.receipt,
                decision.metadata,
            )
            if how == DUPLEX:
                out_body = new_body if new_body is not None else body
                assert out_body is not None
                out = [answer, *m.streamed_body_responses(out_body, not trailers)]
            elif how == HELD_CHUNKS:
                out = [answer]
                replaced = new_body
                for i in range(self._held_chunks):
                    out.append(
                        m.request_body_chunk_response(replaced if i == 0 else None, replace=replaced is not None)
                    )
                self._held_chunks = 0
            else:
                out = [answer]
            if trailers:
                out.append(m.request_trailers_response())
            self.phase = next_phase
            return out
        except EppError as err:
            return [self._refuse(err)]
        except Exception:
            self._log_failure("the decision", _DECIDING)
            return [self._refuse(EppError(ErrorCode.INTERNAL, "internal error in the endpoint picker"))]

    def _answer(self, answer: Answer) -> m.ProcessingResponse:
        """The picker answers the request itself (200, the answer's body): the stream ends, counted a success."""
        self.phase = _FINISHED
        self._release_body()
        self._observer.request_done(None, "", "", self._record, self._clock())
        return m.ok_response(answer.body, answer.content_type)

    if TYPE_CHECKING:  # StreamProcessor's

        def _release_body(self) -> None: ...

        def _refuse(self, err: EppError) -> m.ProcessingResponse: ...

        def _log_failure(self, kind: str | None, phase: Phase) -> None: ...

    def _on_response_headers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        response_headers = msg.response_headers
        headers = m.headers_to_dict(response_headers.headers)
        streaming = "text/event-stream" in headers.get("content-type", "")
        self._response = ResponseTracker(streaming, self._rewrite, self._usage)
        record = self._record
        if record is not None:
            record.response_started_at = self._clock()
            record.streaming = streaming
        decision = self._decision
        if decision is not None:
            served = m.served_endpoint(msg, headers)
            if served is not None and served not in decision.addresses:
                self._observer.served_mismatch()
        next_phase = _RESPONSE_BODY
        if response_headers.end_of_stream:
            self._complete()
            next_phase = _RESPONSE_DONE
        # A model name we put back changes the body's length: let Envoy re-frame it instead of a stale length.
        remove = ("content-length",) if self._rewrite is not None and self._response_body_mode != NONE else ()
        add = decision.response_headers if decision is not None else ()  # e.g. the session token to echo back
        mutation = m.header_mutation(add, remove) if remove or add else None
        return [m.response_headers_response(mutation)], next_phase

    def _on_response_body(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        chunk = msg.response_body
        tracker = self._response
        record = self._record
        first = False
        if record is not None:
            first = record.first_byte_at < 0
            self._observer.response_chunk(record, self._clock(), len(chunk.body))
        decision = self._decision
        if decision is not None:
            if first and decision.pick is not None:  # the first byte: its prefill is done, its TTFT known
                self._bookings.first_byte(decision, self._timing(record))
            elif decision.prefill:  # the first byte (the director releases it once per decision)
                self._bookings.first_byte(decision)
        if tracker is None:  # response headers were skipped: a plain JSON body is assumed
            tracker = self._response = ResponseTracker(False, self._rewrite, self._usage)
        body, usage = tracker.feed(chunk.body, chunk.end_of_stream)
        if usage is not None:
            self._report_usage(usage)
        next_phase = _RESPONSE_BODY
        if chunk.end_of_stream:
            self._complete()
            next_phase = _RESPONSE_DONE
        if self._response_body_mode == FULL_DUPLEX:
            return m.streamed_body_responses(body, chunk.end_of_stream, request=False), next_phase
        return [m.response_body_response(body if tracker.rewrites else None)], next_phase

    def _on_response_trailers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        self._complete()
        return [m.response_trailers_response()], _RESPONSE_DONE

    def _report_usage(self, usage: Usage) -> None:
        if not usage.valid:
            self._observer.usage_invalid()
            return
        decision = self._decision
        self._observer.usage(
            decision.original_model if decision else "",
            usage.prompt_tokens,
            usage.completion_tokens,
            self._record,
            usage.cached_tokens,
        )

    def _unchanged(self, msg: m.ProcessingRequest, kind: str) -> tuple[_Answers, Phase]:
        """The answer that lets a response message through as Envoy sent it (after a failure of ours)."""
        if kind == "response_headers":
            if msg.response_headers.end_of_stream:
                self._complete()
                return [m.response_headers_response()], _RESPONSE_DONE
            return [m.response_headers_response()], _RESPONSE_BODY
        if kind == "response_body":
            chunk = msg.response_body
            next_phase = _RESPONSE_BODY
            if chunk.end_of_stream:
                self._complete()
                next_phase = _RESPONSE_DONE
            if self._response_body_mode == FULL_DUPLEX:
                return m.streamed_body_responses(chunk.body, chunk.end_of_stream, request=False), next_phase
            return [m.response_body_response()], next_phase
        self._complete()
        return [m.response_trailers_response()], _RESPONSE_DONE

    def _complete(self, ended: bool = True) -> None:
        """The request ended (`ended`: its response did, not the stream under it): release its booking with what
        the response cost (the observation feed's timing), and count it, exactly once."""
        decision = self._decision
        if decision is None:
            return
        self._decision = None
        now = self._clock()
        record = self._record
        timing = self._timing(record) if ended and record is not None and decision.pick is not None else None
        self._bookings.complete(decision, timing)
        self._observer.request_done(None, decision.original_model, decision.target_model, record, now)

    def _timing(self, record: Any) -> Timing:
        """The response's cost from what the metrics' record holds (first byte, last chunk, usage), durations from
        the decision on."""
        decided = self._decided_at
        first: float = record.first_byte_at
        tokens = record.tokens
        output = tokens[1] if tokens is not None else -1
        streaming: bool = record.streaming
        ttft = first - decided if first >= 0 else _NAN
        tpot = (record.last_chunk_at - first) / (output - 1) if streaming and first >= 0 and output > 1 else _NAN
        return Timing(ttft, tpot, output, streaming, max(0.0, decided - record.received_at))
