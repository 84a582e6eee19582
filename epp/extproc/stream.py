"""One ext_proc stream as a pure state machine: messages in, responses out, no I/O.

Envoy opens one stream per HTTP request and sends, depending on the processing mode, request headers, body chunks,
trailers, then the same for the response. Every message that expects an answer gets exactly one, in order.

The stream is always in one `Phase`, and `TRANSITIONS` is the whole protocol: for each phase, the message kinds
that may arrive, the action that answers each, and the phases it may lead to. A kind the table does not list for
the current phase is out of order: it gets a clear 400 ImmediateResponse and the stream ends (every later
message is ignored). So a stream decides at most once, and answers nothing twice or unasked.

Request body modes (read from `protocol_config` on the first message):
- FULL_DUPLEX_STREAMED (upstream's mode): Envoy streams body chunks without waiting. We hold the headers answer
  until the body is complete, decide, then answer the headers (decision, `clear_route_cache`) and send the body back
  as streamed chunks of ≤ 62,000 bytes.
- BUFFERED / BUFFERED_PARTIAL: the headers are answered at once (pass-through, our routing headers removed); the
  decision rides on the answer to the single body message.
- STREAMED: Envoy waits for the headers answer before it sends the body, so the pick is made on the headers alone
  (a pool-level pick, no model) and every body chunk is answered with a pass-through. When the gateway sets
  `send_body_without_waiting_for_header_response`, the chunks come first: they are buffered, the decision is made on
  the whole body, and the headers answer goes out followed by one answer per chunk.
- NONE, or a request with no body: decided on the headers alone.

Whatever goes wrong — bad JSON, an oversized body, no endpoint, a bug — becomes an ImmediateResponse with a clear
status and reason while the request is being decided; no exception leaves `handle`. Once the request went on, a
failure in the response phases answers the message unchanged: a good response is never broken by the picker.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp import wire
from epp.director import Decision
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.extproc.bounds import BodyBudget
from epp.extproc.response import ResponseTracker, Usage, model_restorer
from epp.observability.metrics import RequestRecord
from epp.observability.ratelimit import RateLimitedLog
from epp.requests import DEFAULT_PARSERS, InferenceRequest, ParserChain, UsageDialect

log = logging.getLogger(__name__)

_Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _Mode.FULL_DUPLEX_STREAMED
BUFFERED = _Mode.BUFFERED
STREAMED = _Mode.STREAMED
NONE = _Mode.NONE


class Decider(Protocol):
    """The director, as the protocol sees it."""

    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision: ...

    def complete(self, decision: Decision) -> None: ...


class StreamObserver(Protocol):
    """Where a stream reports what happened (the metrics); every method is cheap and never raises.

    `request_started` hands out the stream's record (epp.observability.metrics.RequestRecord), passed back on
    every later call so the labels of a request are resolved once."""

    def request_started(self, now: float) -> RequestRecord: ...

    def decided(
        self,
        record: RequestRecord | None,
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
        record: RequestRecord | None = None,
        now: float = 0.0,
        fairness_id: str | None = None,
        objective: str | None = None,
    ) -> None: ...

    def response_chunk(self, record: RequestRecord, now: float, size: int) -> None: ...

    def usage(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        record: RequestRecord | None = None,
        cached_tokens: int = -1,
    ) -> None: ...

    def usage_invalid(self) -> None: ...

    def served_mismatch(self) -> None: ...

    def stream_refused(self, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class StreamSettings:
    max_body_bytes: int = 16 * 1024 * 1024
    parsers: ParserChain = DEFAULT_PARSERS  # requestHandler.parsers: which parser reads a request, by its path


class Phase(enum.IntEnum):
    """Where a stream stands; the names say what the stream waits for."""

    REQUEST_HEADERS = 0  # nothing has arrived yet
    REQUEST_BODY = 1  # headers seen, the body (and trailers) to come; not decided
    REQUEST_PASS = 2  # decided on the headers (STREAMED); the body chunks pass through
    RESPONSE_HEADERS = 3  # decided; request trailers may still come, then the response
    RESPONSE_BODY = 4  # response headers seen; body chunks flow
    RESPONSE_DONE = 5  # the response ended
    FINISHED = 6  # an ImmediateResponse was sent, or the server gave up: every message is ignored


# Module-level names for the phases: an enum member read through its class costs ~10x a global on the hot path.
_REQUEST_HEADERS, _REQUEST_BODY, _REQUEST_PASS, _RESPONSE_HEADERS, _RESPONSE_BODY, _RESPONSE_DONE, _FINISHED = Phase

# ProcessingRequest's methods taken from the class once: called through a message, upb first looks the method's
# name up among the message's fields (~0.5k instructions a call, three calls a request).
_has_field = m.ProcessingRequest.HasField
_which_oneof = m.ProcessingRequest.WhichOneof

_Answers = list[m.ProcessingResponse]
_Action = Callable[["StreamProcessor", m.ProcessingRequest], tuple[_Answers, Phase]]


class Transition(NamedTuple):
    action: _Action
    leads_to: frozenset[Phase]


_PHASE_WORDS = {
    _REQUEST_HEADERS: "before request_headers",
    _REQUEST_BODY: "while the request body is still arriving",
    _REQUEST_PASS: "while the request body is passing through",
    _RESPONSE_HEADERS: "after the request was complete and before the response",
    _RESPONSE_BODY: "while the response body is arriving",
    _RESPONSE_DONE: "after the response ended",
}


class StreamProcessor:
    """The state of one request's ext_proc stream. Not thread-safe; one instance per stream."""

    __slots__ = (
        "_answers",
        "_body",
        "_budget",
        "_clock",
        "_config_seen",
        "_decided",
        "_decider",
        "_decision",
        "_early_body",
        "_headers",
        "_held_chunks",
        "_observer",
        "_record",
        "_request",
        "_request_body_mode",
        "_reserved",
        "_response",
        "_response_body_mode",
        "_rewrite",
        "_settings",
        "_subset",
        "_usage",
        "_warn",
        "phase",
    )

    def __init__(
        self,
        decider: Decider,
        observer: StreamObserver,
        clock: Callable[[], float],
        settings: StreamSettings = StreamSettings(),
        answers: m.DecisionAnswers | None = None,
        budget: BodyBudget | None = None,
        warn: RateLimitedLog | None = None,
    ) -> None:
        self._decider = decider
        self._observer = observer
        self._clock = clock
        self._settings = settings
        self._answers = answers if answers is not None else m.DecisionAnswers()
        self._budget = budget
        self._warn = warn
        self._config_seen = False
        self._request_body_mode = BUFFERED  # Envoy's default when no protocol_config is sent
        self._response_body_mode = NONE
        self._early_body = False
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._reserved = 0  # bytes of `_body` taken from the server's budget
        self._held_chunks = 0  # STREAMED with early body: chunks whose answers wait for the decision
        self._subset: list[str] | None = None
        self._decided = False
        self._decision: Decision | None = None
        self._rewrite: tuple[bytes, bytes] | None = None
        self._response: ResponseTracker | None = None
        self._usage = UsageDialect.OPENAI  # how the response reports usage: the request's parser says
        self._record: RequestRecord | None = None  # what the metrics learn about this request, from its headers on
        self._request: InferenceRequest | None = None  # parsed (labels of a refusal after parsing)
        self.phase = _REQUEST_HEADERS

    @property
    def finished(self) -> bool:
        return self.phase is _FINISHED

    @property
    def in_flight(self) -> bool:
        """Decided and sent on, not yet ended: its booking is held."""
        return self._decision is not None and self.phase is not _FINISHED

    # -- entry points -----------------------------------------------------------------------------------------

    def handle(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        """Answer one message from Envoy. Never raises."""
        phase = self.phase
        if phase is _FINISHED:
            return []
        kind = None
        try:
            if not self._config_seen and _has_field(msg, "protocol_config"):
                self._config_seen = True
                config = msg.protocol_config
                self._request_body_mode = config.request_body_mode
                self._response_body_mode = config.response_body_mode
                self._early_body = config.send_body_without_waiting_for_header_response
            if self._subset is None and _has_field(msg, "metadata_context"):
                self._subset = m.subset_hint(msg)
            kind = _which_oneof(msg, "request")
            transition = _BY_PHASE[phase].get(kind) if kind is not None else None
            if transition is None:
                raise EppError(ErrorCode.BAD_REQUEST, _out_of_order(kind, phase))
            answers, self.phase = transition.action(self, msg)
            return answers
        except EppError as err:
            return [self._refuse(err)]
        except Exception:
            if self._warn is not None:
                self._warn.log(
                    "stream-failure",
                    logging.ERROR,
                    "ext_proc stream failed on %s in %s",
                    kind,
                    phase.name,
                    exc_info=True,
                )
            else:
                log.exception("ext_proc stream failed on %s in %s", kind, phase.name)
            if phase >= _RESPONSE_HEADERS and kind is not None and kind.startswith("response_"):
                answers, self.phase = self._unchanged(msg, kind)
                return answers
            return [self._refuse(EppError(ErrorCode.INTERNAL, "internal error in the endpoint picker"))]

    def decides_on(self, msg: m.ProcessingRequest) -> tuple[dict[str, str], int] | None:
        """Whether answering `msg` would decide the request: then (its headers, its body size so far), so flow
        control can hold the stream before `handle`; None otherwise. Mirrors the decision points of the
        transitions (headers with end_of_stream, STREAMED and NONE headers, the end of a buffered, duplex or
        early STREAMED body, request trailers); a message the table refuses is not a decision point."""
        phase = self.phase
        if self._decided or phase not in (_REQUEST_HEADERS, _REQUEST_BODY):
            return None
        kind = _which_oneof(msg, "request")
        if phase is _REQUEST_HEADERS:
            if kind != "request_headers":
                return None
            mode = self._request_body_mode
            if self._config_seen is False and _has_field(msg, "protocol_config"):
                mode = msg.protocol_config.request_body_mode
                early = msg.protocol_config.send_body_without_waiting_for_header_response
            else:
                early = self._early_body
            request_headers = msg.request_headers
            headers = m.headers_to_dict(request_headers.headers)
            if request_headers.end_of_stream:
                return headers, 0
            if mode == FULL_DUPLEX or (mode == STREAMED and early) or mode not in (STREAMED, NONE):
                return None
            return headers, 0
        mode = self._request_body_mode
        if kind == "request_body":
            size = len(self._body) + len(msg.request_body.body)
            if mode in (FULL_DUPLEX, STREAMED) and not msg.request_body.end_of_stream:
                return None
            return self._headers, size
        if kind == "request_trailers" and mode in (FULL_DUPLEX, STREAMED):
            return self._headers, len(self._body)
        return None

    def request_for(self, msg: m.ProcessingRequest) -> InferenceRequest | None:
        """The request `msg` would decide, parsed ahead of `handle`, for I/O the decision needs first (a vllm
        token-producer's render call); None when `msg` is no decision point or its body does not parse (`handle`
        then answers that). Copies the buffered body: used only when such a producer is configured."""
        pending = self.decides_on(msg)
        if pending is None:
            return None
        headers = pending[0]
        kind = _which_oneof(msg, "request")
        body: bytes | None = None
        if kind == "request_body":
            body = bytes(self._body) + msg.request_body.body
        elif kind == "request_trailers":
            body = bytes(self._body)
        path = headers.get(":path", "/")
        parsers = self._settings.parsers
        try:
            if body is None:
                return parsers.without_body("", path, headers)
            return parsers.parse("", path, headers, body)
        except EppError:
            return None

    def refuse(self, err: EppError) -> list[m.ProcessingResponse]:
        """Answer the request with an ImmediateResponse now: flow control refused it before its decision, or
        evicted it in flight (then its booking is released too)."""
        if self.phase is _FINISHED:
            return []
        if self._record is None:
            self._record = self._observer.request_started(self._clock())
        return [self._refuse(err)]

    def expire(self, idle_s: float) -> list[m.ProcessingResponse]:
        """The server stops waiting for this stream. Before the request was decided the client gets a clear
        503; after it, nothing is answered (Envoy goes on without the picker when the stream closes)."""
        if self.phase is _FINISHED:
            return []
        self._observer.stream_refused("idle_timeout")
        if self.phase < _RESPONSE_HEADERS:
            err = EppError(
                ErrorCode.SERVICE_UNAVAILABLE, f"no ext_proc message for {idle_s:g}s; the request is dropped"
            )
            return [self._refuse(err)]
        self.phase = _FINISHED
        self._complete()
        return []

    def close(self) -> None:
        """The stream ended, normally or not: release the in-flight booking and buffered bytes exactly once."""
        if self._reserved or self._body:
            self._release_body()
        self._complete()

    # -- request phase ----------------------------------------------------------------------------------------

    def _on_request_headers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        request_headers = msg.request_headers
        self._headers = m.headers_to_dict(request_headers.headers)
        self._record = self._observer.request_started(self._clock())
        mode = self._request_body_mode
        if request_headers.end_of_stream:
            return [self._decision_answer("headers", None)], _RESPONSE_HEADERS
        if mode == FULL_DUPLEX or (mode == STREAMED and self._early_body):
            return [], _REQUEST_BODY  # the answer waits for the whole body
        if mode == STREAMED:
            return [self._decision_answer("headers", None, body_unseen=True)], _REQUEST_PASS
        if mode == NONE:  # the body goes on without ever reaching the picker
            return [self._decision_answer("headers", None, body_unseen=True)], _RESPONSE_HEADERS
        return [self._answers.pass_through_headers], _REQUEST_BODY

    def _on_request_body(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        chunk = msg.request_body
        data = chunk.body
        mode = self._request_body_mode
        if mode == FULL_DUPLEX:
            if not chunk.end_of_stream:
                self._buffer(data)
                return [], _REQUEST_BODY
            if self._body:
                self._buffer(data)
                data = bytes(self._body)
            else:
                self._check_size(len(data))  # the usual one-chunk body: not copied into the buffer and out again
            return self._finish_duplex(data, end_of_stream=True), _RESPONSE_HEADERS
        if mode == STREAMED:  # with early body (otherwise the phase would be REQUEST_PASS)
            self._buffer(data)
            self._held_chunks += 1
            if not chunk.end_of_stream:
                return [], _REQUEST_BODY
            return self._finish_streamed(), _RESPONSE_HEADERS
        # BUFFERED / BUFFERED_PARTIAL: one message carries the body (or, partial, the part that fitted).
        self._check_size(len(data))
        return [self._decision_answer("body", data)], _RESPONSE_HEADERS

    def _on_request_trailers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        """Trailers end a body that came without end_of_stream: decide now, then answer everything in order."""
        mode = self._request_body_mode
        if mode == FULL_DUPLEX:
            out = self._finish_duplex(bytes(self._body), end_of_stream=False)
        elif mode == STREAMED:
            out = self._finish_streamed()
        else:
            raise EppError(ErrorCode.BAD_REQUEST, "request_trailers arrived before the request body (BUFFERED)")
        out.append(m.request_trailers_response())
        return out, _RESPONSE_HEADERS

    def _on_passed_body(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        next_phase = _RESPONSE_HEADERS if msg.request_body.end_of_stream else _REQUEST_PASS
        return [m.request_body_response()], next_phase

    def _on_late_request_trailers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        return [m.request_trailers_response()], _RESPONSE_HEADERS

    def _buffer(self, data: bytes) -> None:
        self._check_size(len(self._body) + len(data))
        budget = self._budget
        if budget is not None and data:
            if not budget.take(len(data)):
                self._observer.stream_refused("body_budget")
                if self._warn is not None:
                    self._warn.log(
                        "body-budget",
                        logging.WARNING,
                        "refusing a request: %d bytes of request bodies are buffered, the limit "
                        "(--max-buffered-body-bytes) is %d",
                        budget.used,
                        budget.limit,
                    )
                raise EppError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    "the endpoint picker is buffering too many request bodies; retry later",
                )
            self._reserved += len(data)
        self._body += data

    def _check_size(self, size: int) -> None:
        if size > self._settings.max_body_bytes:
            raise EppError(
                ErrorCode.BODY_TOO_LARGE, f"request body exceeds the limit of {self._settings.max_body_bytes} bytes"
            )

    def _release_body(self) -> None:
        if self._reserved:
            assert self._budget is not None
            self._budget.give(self._reserved)
            self._reserved = 0
        if self._body:
            self._body = bytearray()

    def _finish_duplex(self, body: bytes, end_of_stream: bool) -> _Answers:
        if self._reserved or self._body:  # the usual one-chunk body was never buffered
            self._release_body()
        headers = self._decision_answer("headers", body)
        decision = self._decision
        out_body = decision.body if decision is not None and decision.body is not None else body
        return [headers, *m.streamed_body_responses(out_body, end_of_stream)]

    def _finish_streamed(self) -> _Answers:
        """STREAMED with early body: the decision, then one answer per chunk (a new body rides on the first)."""
        body = bytes(self._body)
        self._release_body()
        out = [self._decision_answer("headers", body)]
        decision = self._decision
        replaced = decision.body if decision is not None else None
        for i in range(self._held_chunks):
            out.append(m.request_body_chunk_response(replaced if i == 0 else None, replace=replaced is not None))
        self._held_chunks = 0
        return out

    def _decision_answer(self, phase: str, body: bytes | None, body_unseen: bool = False) -> m.ProcessingResponse:
        """Parse, ask the director, and build the answer that carries the decision (on the headers or the body)."""
        if self._decided:  # the table makes this unreachable; a second booking would never be released
            raise EppError(ErrorCode.INTERNAL, "a second decision on one ext_proc stream")
        self._decided = True
        started = self._clock()
        headers = self._headers
        request_id = headers.get("x-request-id") or ""
        generated = not request_id
        if generated:
            request_id = uuid.uuid4().hex
        record = self._record
        if record is not None and body is not None:
            record.request_bytes = len(body)
        path = headers.get(":path", "/")
        parsers = self._settings.parsers
        if body_unseen:
            request = parsers.without_body(request_id, path, headers)
        else:
            request = parsers.parse(request_id, path, headers, body)
        self._usage = request.usage
        self._request = request
        decision = self._decider.decide(request, self._subset)
        self._decision = decision
        now = self._clock()
        self._observer.decided(
            record,
            started,
            now,
            decision.original_model,
            decision.target_model,
            request.fairness_id,
            request.objective,
            decision.addresses[0] if decision.addresses else "",
        )
        destination = decision.header_value
        set_headers: tuple[tuple[str, str], ...] = ((wire.DESTINATION_HEADER, destination), *decision.headers)
        if generated:
            set_headers = (("x-request-id", request_id), *set_headers)
        if decision.body is not None:
            set_headers = (*set_headers, ("content-length", str(len(decision.body))))
        if decision.target_model and decision.target_model != decision.original_model:
            self._rewrite = model_restorer(decision.target_model, decision.original_model)
        replaced = decision.body if phase == "body" else None
        cacheable = not generated and decision.body is None  # a fresh request id or body length is one request's
        return self._answers.decision(phase, set_headers, destination, replaced, cacheable, decision.scores)

    # -- response phase ---------------------------------------------------------------------------------------

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

    # -- endings ----------------------------------------------------------------------------------------------

    def _complete(self) -> None:
        decision = self._decision
        if decision is None:
            return
        self._decision = None
        self._decider.complete(decision)
        self._observer.request_done(None, decision.original_model, decision.target_model, self._record, self._clock())

    def _refuse(self, err: EppError) -> m.ProcessingResponse:
        self.phase = _FINISHED
        self._release_body()
        if self._decision is not None:
            self._decider.complete(self._decision)
            self._decision = None
        # Per-request refusals are counted in metrics; the log gets them at DEBUG only (hot path).
        log.debug("refusing request: %s", err.body)
        request = self._request
        if request is None:
            self._observer.request_done(err.code, "", "", self._record, self._clock())
        else:
            self._observer.request_done(
                err.code, request.model, request.model, self._record, self._clock(), request.fairness_id,
                request.objective,
            )  # fmt: skip
        return m.immediate_response(err)


def _out_of_order(kind: str | None, phase: Phase) -> str:
    if kind is None:
        return "ext_proc message without a known kind"
    return f"ext_proc message {kind} {_PHASE_WORDS[phase]}"


def _to(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


_S = StreamProcessor
# The whole protocol: phase → message kind → (action, phases it may lead to). Anything not listed is out of order.
TRANSITIONS: dict[Phase, dict[str, Transition]] = {
    _REQUEST_HEADERS: {
        "request_headers": Transition(_S._on_request_headers, _to(_REQUEST_BODY, _REQUEST_PASS, _RESPONSE_HEADERS)),
    },
    _REQUEST_BODY: {
        "request_body": Transition(_S._on_request_body, _to(_REQUEST_BODY, _RESPONSE_HEADERS)),
        "request_trailers": Transition(_S._on_request_trailers, _to(_RESPONSE_HEADERS)),
    },
    _REQUEST_PASS: {
        "request_body": Transition(_S._on_passed_body, _to(_REQUEST_PASS, _RESPONSE_HEADERS)),
        "request_trailers": Transition(_S._on_late_request_trailers, _to(_RESPONSE_HEADERS)),
    },
    _RESPONSE_HEADERS: {
        "request_trailers": Transition(_S._on_late_request_trailers, _to(_RESPONSE_HEADERS)),
        "response_headers": Transition(_S._on_response_headers, _to(_RESPONSE_BODY, _RESPONSE_DONE)),
        # Response headers skipped (header mode SKIP) with the body sent: the body starts the response.
        "response_body": Transition(_S._on_response_body, _to(_RESPONSE_BODY, _RESPONSE_DONE)),
        "response_trailers": Transition(_S._on_response_trailers, _to(_RESPONSE_DONE)),
    },
    _RESPONSE_BODY: {
        "response_body": Transition(_S._on_response_body, _to(_RESPONSE_BODY, _RESPONSE_DONE)),
        "response_trailers": Transition(_S._on_response_trailers, _to(_RESPONSE_DONE)),
    },
    _RESPONSE_DONE: {},
    _FINISHED: {},
}
# The same table indexed by phase number: an IntEnum dict key hashes through Python code, a tuple index does not.
_BY_PHASE = tuple(TRANSITIONS[phase] for phase in Phase)
