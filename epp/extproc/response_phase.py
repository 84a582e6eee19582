"""An ext_proc stream from its decision on, as a base of `StreamProcessor`: the answer that carries the decision,
then the response's transitions.

`_decision_answer` builds the answer that carries the pipeline's decision (`StreamProcessor.resume` sends it with
whatever the deciding message held back). Then the request went on: the stream reads the response's usage in the
dialect of the request's parser, puts a rewritten model name back, echoes the headers a plugin asked for, and ends
the request (its booking released, counted) when the response ends. A failure of ours here never breaks a good
response: the message is answered unchanged (`_unchanged`). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Protocol

from epp import wire
from epp.director.decision import Decision
from epp.extproc import messages as m
from epp.extproc.observer import StreamObserver
from epp.extproc.phases import Phase
from epp.extproc.response import ResponseTracker, Usage, model_restorer
from epp.requests import UsageDialect

_RESPONSE_BODY, _RESPONSE_DONE = Phase.RESPONSE_BODY, Phase.RESPONSE_DONE
FULL_DUPLEX = m.FULL_DUPLEX
NONE = m.NONE

_Answers = list[m.ProcessingResponse]

# What the decision's answers are (`StreamProcessor._then`): the decision on the headers answer alone; on the
# buffered body's answer; on the headers answer followed by the body streamed back (FULL_DUPLEX); on the headers
# answer followed by one answer per held chunk (STREAMED with early body).
ON_HEADERS, ON_BODY, DUPLEX, HELD_CHUNKS = range(4)


class Bookings(Protocol):
    """Who releases a decision's booking when its request ends (the director's pipeline on the serving path)."""

    def complete(self, decision: Decision) -> None: ...


class ResponsePhases:
    """The response transitions and the request's ending; the state lives in `StreamProcessor`'s slots."""

    __slots__ = ("_decision", "_held_chunks", "_response", "_response_body_mode", "_rewrite", "_usage")

    _answers: m.DecisionAnswers
    _bookings: Bookings
    _generated_id: str
    _held_chunks: int
    _observer: StreamObserver[Any]
    _clock: Any
    _decision: Decision | None
    _record: Any
    _response: ResponseTracker | None
    _response_body_mode: int
    _rewrite: tuple[bytes, bytes] | None
    _usage: UsageDialect

    def _decision_answer(self, decision: Decision, on_body: bool) -> m.ProcessingResponse:
        """The answer that carries the decision: on the headers, or on the (buffered) body."""
        destination = decision.header_value
        set_headers: tuple[tuple[str, str], ...] = ((wire.DESTINATION_HEADER, destination), *decision.headers)
        generated = self._generated_id
        if generated:
            set_headers = (("x-request-id", generated), *set_headers)
        if decision.body is not None:
            set_headers = (*set_headers, ("content-length", str(len(decision.body))))
        if decision.target_model and decision.target_model != decision.original_model:
            self._rewrite = model_restorer(decision.target_model, decision.original_model)
        replaced = decision.body if on_body else None
        cacheable = not generated and decision.body is None  # a fresh request id or body length is one request's
        phase = "body" if on_body else "headers"
        return self._answers.decision(phase, set_headers, destination, replaced, cacheable, decision.scores)

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
        if self._record is not None:
            self._observer.response_chunk(self._record, self._clock(), len(chunk.body))
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

    def _complete(self) -> None:
        """The request ended: release its booking and count it, exactly once."""
        decision = self._decision
        if decision is None:
            return
        self._decision = None
        self._bookings.complete(decision)
        self._observer.request_done(None, decision.original_model, decision.target_model, self._record, self._clock())
