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
- NONE: decided on the headers alone. A request with no body at all (request headers with end_of_stream, e.g. `GET
  /v1/models` or a header-only POST) is decided on its headers in every mode, whatever its path (upstream routes
  it to an endpoint of the pool without parsing; with none, 500 `no pods available in datastore`).

The stream never decides itself: the message that completes what the decision reads (headers with end_of_stream,
STREAMED or NONE headers, the end of a buffered, duplex or early STREAMED body, request trailers) is parsed, once,
and answered with its `NeedDecision` — the parsed request itself, the gateway's subset hint in `subset` — (the
phase becomes DECIDING). The adapter runs the director's pipeline on it (tokenize → flow-control hold → decide,
`epp.director.pipeline`) and hands the outcome back with `resume`, which answers what that message and the ones it
held wait for. The request's path is `:path`, else `x-original-path`, else
`x-forwarded-path`, else `/v1/completions` (upstream's order).

Whatever goes wrong — bad JSON, an oversized body, no endpoint, a bug — becomes an ImmediateResponse with a clear
status and reason while the request is being decided; no exception leaves `handle` or `resume`. Once the request
went on, a failure in the response phases answers the message unchanged (`epp.extproc.response_phase`): a good
response is never broken by the picker. Pure: no I/O, no clock of its own (the clock is an argument).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from epp.director.decision import Decision, NeedDecision
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.extproc.bounds import BodyBudget
from epp.extproc.observer import StreamObserver, Warnings
from epp.extproc.phases import Phase, out_of_order
from epp.extproc.response import ResponseTracker
from epp.extproc.response_phase import DUPLEX, HELD_CHUNKS, ON_BODY, ON_HEADERS, Bookings, ResponsePhases
from epp.requests import DEFAULT_PARSERS, InferenceRequest, ParserChain, request_path

__all__ = ["TRANSITIONS", "Bookings", "Phase", "StreamProcessor", "StreamSettings", "Transition"]

log = logging.getLogger(__name__)

FULL_DUPLEX, BUFFERED, STREAMED, NONE = m.FULL_DUPLEX, m.BUFFERED, m.STREAMED, m.NONE


@dataclass(frozen=True, slots=True)
class StreamSettings:
    max_body_bytes: int = 16 * 1024 * 1024
    parsers: ParserChain = DEFAULT_PARSERS  # requestHandler.parsers: which parser reads a request, by its path


# Module-level names for the phases: an enum member read through its class costs ~10x a global on the hot path.
_REQUEST_HEADERS, _REQUEST_BODY, _REQUEST_PASS, _DECIDING, _RESPONSE_HEADERS = tuple(Phase)[:5]
_RESPONSE_BODY, _RESPONSE_DONE, _FINISHED = tuple(Phase)[5:]

# ProcessingRequest's methods taken from the class once: called through a message, upb first looks the method's
# name up among the message's fields (~0.5k instructions a call, three calls a request).
_has_field = m.ProcessingRequest.HasField
_which_oneof = m.ProcessingRequest.WhichOneof

_Answers = list[m.ProcessingResponse]
_Action = Callable[["StreamProcessor", m.ProcessingRequest], tuple["_Answers | NeedDecision", Phase]]

_ON_HEADERS, _ON_BODY, _DUPLEX, _HELD_CHUNKS = ON_HEADERS, ON_BODY, DUPLEX, HELD_CHUNKS


class Transition(NamedTuple):
    action: _Action
    leads_to: frozenset[Phase]  # the phases after the message, the one after its decision included


class StreamProcessor(ResponsePhases):
    """The state of one request's ext_proc stream. Not thread-safe; one instance per stream."""

    __slots__ = (
        "_answers",
        "_body",
        "_bookings",
        "_budget",
        "_clock",
        "_config_seen",
        "_early_body",
        "_generated_id",
        "_headers",
        "_observer",
        "_record",
        "_request",
        "_request_body_mode",
        "_reserved",
        "_settings",
        "_warn",
        "subset",
    )

    def __init__(
        self,
        bookings: Bookings,
        observer: StreamObserver[Any],
        clock: Callable[[], float],
        settings: StreamSettings = StreamSettings(),
        answers: m.DecisionAnswers | None = None,
        budget: BodyBudget | None = None,
        warn: Warnings | None = None,
    ) -> None:
        """`bookings` releases the decision's booking when the request ends (the director's pipeline)."""
        self._bookings = bookings
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
        # `_headers` (request headers) and `_usage` (the parser's usage dialect) are set before any read: the
        # table lets no message that reads them come before the request headers and the decision.
        self._body = bytearray()
        self._reserved = 0  # bytes of `_body` taken from the server's budget
        self._held_chunks = 0  # STREAMED with early body: chunks whose answers wait for the decision
        self.subset: list[str] | None = None  # the gateway's endpoint subset hint, read with the request
        self._decision: Decision | None = None
        self._decided_at = 0.0
        self._generated_id = ""  # the request id we made up for a request without one (sent on as a header)
        self._rewrite: tuple[bytes, bytes] | None = None
        self._response: ResponseTracker | None = None
        self._record: Any = None  # what the metrics learn about this request, from its headers on
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

    def handle(self, msg: m.ProcessingRequest) -> _Answers | NeedDecision:
        """Answer one message from Envoy, or, when it completes what the decision reads, return the request's
        `NeedDecision` (answer it with `resume`). Never raises."""
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
            if self.subset is None and _has_field(msg, "metadata_context"):
                self.subset = m.subset_hint(msg)
            kind = _which_oneof(msg, "request")
            transition = _BY_PHASE[phase].get(kind) if kind is not None else None
            if transition is None:
                raise EppError(ErrorCode.BAD_REQUEST, out_of_order(kind, phase))
            answers, self.phase = transition.action(self, msg)
            return answers
        except EppError as err:
            return [self._refuse(err)]
        except Exception:
            self._log_failure(kind, phase)
            if phase >= _RESPONSE_HEADERS and kind is not None and kind.startswith("response_"):
                answers, self.phase = self._unchanged(msg, kind)
                return answers
            return [self._refuse(EppError(ErrorCode.INTERNAL, "internal error in the endpoint picker"))]

    def refuse(self, err: EppError) -> _Answers:
        """Answer the request with an ImmediateResponse now (flow control evicted it in flight: its booking is
        released too)."""
        if self.phase is _FINISHED:
            return []
        if self._record is None:
            self._record = self._observer.request_started(self._clock())
        return [self._refuse(err)]

    def expire(self, idle_s: float) -> _Answers:
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
        self._complete(False)
        return []

    def close(self) -> None:
        """The stream ended, normally or not: release the in-flight booking and buffered bytes exactly once (a
        response still going is no observation of what it costs)."""
        if self._reserved or self._body:
            self._release_body()
        self._complete(False)

    # -- request phase ----------------------------------------------------------------------------------------

    def _on_request_headers(self, msg: m.ProcessingRequest) -> tuple[_Answers | NeedDecision, Phase]:
        request_headers = msg.request_headers
        self._headers = m.headers_to_dict(request_headers.headers)
        self._record = self._observer.request_started(self._clock())
        mode = self._request_body_mode
        if request_headers.end_of_stream:  # no body at all
            return self._need(_ON_HEADERS, None, _RESPONSE_HEADERS, False, False, True), _DECIDING
        if mode == FULL_DUPLEX or (mode == STREAMED and self._early_body):
            return [], _REQUEST_BODY  # the answer waits for the whole body
        if mode == STREAMED:
            return self._need(_ON_HEADERS, None, _REQUEST_PASS, False, True), _DECIDING
        if mode == NONE:  # the body goes on without ever reaching the picker
            return self._need(_ON_HEADERS, None, _RESPONSE_HEADERS, False, True), _DECIDING
        return [self._answers.pass_through_headers], _REQUEST_BODY

    def _on_request_body(self, msg: m.ProcessingRequest) -> tuple[_Answers | NeedDecision, Phase]:
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
                self._release_body()
            elif len(data) > self._settings.max_body_bytes:  # the usual one-chunk body: not copied, checked here
                self._check_size(len(data))
            return self._need(_DUPLEX, data, _RESPONSE_HEADERS), _DECIDING
        if mode == STREAMED:  # with early body (otherwise the phase would be REQUEST_PASS)
            self._buffer(data)
            self._held_chunks += 1
            if not chunk.end_of_stream:
                return [], _REQUEST_BODY
            return self._need_held_chunks(False), _DECIDING
        # BUFFERED / BUFFERED_PARTIAL: one message carries the body (or, partial, the part that fitted).
        self._check_size(len(data))
        return self._need(_ON_BODY, data, _RESPONSE_HEADERS), _DECIDING

    def _on_request_trailers(self, msg: m.ProcessingRequest) -> tuple[_Answers | NeedDecision, Phase]:
        """Trailers end a body that came without end_of_stream: decide now, then answer everything in order."""
        mode = self._request_body_mode
        if mode == FULL_DUPLEX:
            body = bytes(self._body)
            self._release_body()
            return self._need(_DUPLEX, body, _RESPONSE_HEADERS, True), _DECIDING
        if mode == STREAMED:
            return self._need_held_chunks(True), _DECIDING
        raise EppError(ErrorCode.BAD_REQUEST, "request_trailers arrived before the request body (BUFFERED)")

    def _on_passed_body(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        next_phase = _RESPONSE_HEADERS if msg.request_body.end_of_stream else _REQUEST_PASS
        return [m.request_body_response()], next_phase

    def _on_late_request_trailers(self, msg: m.ProcessingRequest) -> tuple[_Answers, Phase]:
        return [m.request_trailers_response()], _RESPONSE_HEADERS

    def _need_held_chunks(self, trailers: bool) -> NeedDecision:
        """STREAMED with early body: decide on the whole body; the held chunks are answered after."""
        body = bytes(self._body)
        self._release_body()
        return self._need(_HELD_CHUNKS, body, _RESPONSE_HEADERS, trailers)

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

    # -- the decision -----------------------------------------------------------------------------------------

    def _need(
        self,
        then: int,
        body: bytes | None,
        next_phase: Phase,
        trailers: bool = False,
        body_unseen: bool = False,
        no_body: bool = False,
    ) -> NeedDecision:
        """Parse the request, once, and ask for its decision; `resume` answers `then` and moves to `next_phase`.
        Once per stream: every transition that comes here leaves the request phases (the fuzz test checks it)."""
        self._started = self._clock()
        headers = self._headers
        request_id = headers.get("x-request-id") or ""
        if not request_id:
            request_id = self._generated_id = uuid.uuid4().hex
        record = self._record
        if record is not None and body is not None:
            record.request_bytes = len(body)
        path = headers.get(":path") or request_path(headers)
        parsers = self._settings.parsers
        if no_body or body_unseen:
            request = parsers.without_body(request_id, path, headers, no_body)
        else:
            request = parsers.parse(request_id, path, headers, body)
        self._usage = request.usage
        self._request = request
        self._then = (then, body, next_phase, trailers)
        return request

    # -- endings ----------------------------------------------------------------------------------------------

    def _log_failure(self, kind: str | None, phase: Phase) -> None:
        if self._warn is not None:
            self._warn.log(
                "stream-failure", logging.ERROR, "ext_proc stream failed on %s in %s", kind, phase.name, exc_info=True
            )
        else:
            log.exception("ext_proc stream failed on %s in %s", kind, phase.name)

    def _refuse(self, err: EppError) -> m.ProcessingResponse:
        self.phase = _FINISHED
        self._release_body()
        if self._decision is not None:
            self._bookings.complete(self._decision)
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


def _to(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


_S = StreamProcessor
# The whole protocol: phase → message kind → (action, phases it may lead to). Anything not listed is out of order.
# A message that completes the request leads to DECIDING, and `resume` on to the phase after its decision.
TRANSITIONS: dict[Phase, dict[str, Transition]] = {
    _REQUEST_HEADERS: {
        # FINISHED: a request without a body the picker answers itself (`Answer`: GET /v1/models).
        "request_headers": Transition(
            _S._on_request_headers, _to(_REQUEST_BODY, _DECIDING, _REQUEST_PASS, _RESPONSE_HEADERS, _FINISHED)
        ),
    },
    _REQUEST_BODY: {
        "request_body": Transition(_S._on_request_body, _to(_REQUEST_BODY, _DECIDING, _RESPONSE_HEADERS)),
        "request_trailers": Transition(_S._on_request_trailers, _to(_DECIDING, _RESPONSE_HEADERS)),
    },
    _REQUEST_PASS: {
        "request_body": Transition(_S._on_passed_body, _to(_REQUEST_PASS, _RESPONSE_HEADERS)),
        "request_trailers": Transition(_S._on_late_request_trailers, _to(_RESPONSE_HEADERS)),
    },
    _DECIDING: {},  # the adapter sends nothing until `resume`; a message now is out of order
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
