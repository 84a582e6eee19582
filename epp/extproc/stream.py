"""One ext_proc stream as a pure state machine: messages in, responses out, no I/O.

Envoy opens one stream per HTTP request and sends, depending on the processing mode, request headers, body chunks,
trailers, then the same for the response. Every message that expects an answer gets exactly one, in order.

Request body modes (read from `protocol_config` on the first message):
- FULL_DUPLEX_STREAMED (upstream's mode): Envoy streams body chunks without waiting. We hold the headers answer
  until the body is complete, decide, then answer the headers (decision, `clear_route_cache`) and send the body back
  as streamed chunks of ≤ 62,000 bytes.
- BUFFERED / BUFFERED_PARTIAL: the headers are answered at once (pass-through, our routing headers removed); the
  decision rides on the answer to the single body message.
- NONE / STREAMED, or a request with no body: decided on the headers alone (a pool-level pick, no model).

Whatever goes wrong — bad JSON, an oversized body, no endpoint, a bug — becomes an ImmediateResponse with a clear
status and reason; no exception leaves `handle`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp import wire
from epp.director import Decision
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.observability.metrics import RequestRecord
from epp.requests import InferenceRequest, parse_request

log = logging.getLogger(__name__)

_Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _Mode.FULL_DUPLEX_STREAMED
BUFFERED = _Mode.BUFFERED
BUFFERED_PARTIAL = _Mode.BUFFERED_PARTIAL
NONE = _Mode.NONE

# Headers a client may send that only the picker (or the gateway) may set: removed from the forwarded request.
_STRIP = tuple(h for h in wire.ROUTING_HEADERS if h != wire.DESTINATION_HEADER)
_MAX_USAGE_BUFFER = 1 << 20  # response bytes kept to find `usage`; a larger JSON answer is not searched


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

    def decision_latency(self, seconds: float) -> None: ...

    def response_chunk(self, record: RequestRecord, now: float, size: int) -> None: ...

    def usage(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        record: RequestRecord | None = None,
        cached_tokens: int = -1,
    ) -> None: ...

    def served_mismatch(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StreamSettings:
    max_body_bytes: int = 16 * 1024 * 1024


class StreamProcessor:
    """The state of one request's ext_proc stream. Not thread-safe; one instance per stream."""

    __slots__ = (
        "_body",
        "_clock",
        "_config_seen",
        "_decider",
        "_decision",
        "_headers",
        "_observer",
        "_record",
        "_request",
        "_request_body_mode",
        "_response_body_mode",
        "_response_sse",
        "_response_tail",
        "_rewrite",
        "_settings",
        "_subset",
        "_usage_seen",
        "finished",
    )

    def __init__(
        self,
        decider: Decider,
        observer: StreamObserver,
        clock: Callable[[], float],
        settings: StreamSettings = StreamSettings(),
    ) -> None:
        self._decider = decider
        self._observer = observer
        self._clock = clock
        self._settings = settings
        self._config_seen = False
        self._request_body_mode = BUFFERED  # Envoy's default when no protocol_config is sent
        self._response_body_mode = NONE
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._subset: list[str] | None = None
        self._decision: Decision | None = None
        self._rewrite: tuple[bytes, bytes] | None = None
        self._response_sse = False
        self._response_tail = b""
        self._usage_seen = False
        self._record: RequestRecord | None = None  # what the metrics learn about this request, from its headers on
        self._request: InferenceRequest | None = None  # parsed (labels of a refusal after parsing)
        self.finished = False  # an ImmediateResponse was sent: the stream is over

    # -- entry points -----------------------------------------------------------------------------------------

    def handle(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        """Answer one message from Envoy. Never raises."""
        if self.finished:
            return []
        try:
            if not self._config_seen and msg.HasField("protocol_config"):
                self._config_seen = True
                self._request_body_mode = msg.protocol_config.request_body_mode
                self._response_body_mode = msg.protocol_config.response_body_mode
            if self._subset is None and msg.HasField("metadata_context"):
                self._subset = m.subset_hint(msg)
            kind = msg.WhichOneof("request")
            if kind == "request_headers":
                return self._on_request_headers(msg)
            if kind == "request_body":
                return self._on_request_body(msg)
            if kind == "request_trailers":
                return self._on_request_trailers()
            if kind == "response_headers":
                return self._on_response_headers(msg)
            if kind == "response_body":
                return self._on_response_body(msg)
            if kind == "response_trailers":
                self._complete()
                return [m.response_trailers_response()]
            raise EppError(ErrorCode.BAD_REQUEST, f"unexpected ext_proc message {kind!r}")
        except EppError as err:
            return [self._refuse(err)]
        except Exception:
            log.exception("ext_proc stream failed; answering 500")
            return [self._refuse(EppError(ErrorCode.INTERNAL, "internal error in the endpoint picker"))]

    def close(self) -> None:
        """The stream ended, normally or not: release the in-flight booking exactly once."""
        self._complete()

    # -- request phase ----------------------------------------------------------------------------------------

    def _on_request_headers(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        self._headers = m.headers_to_dict(msg.request_headers.headers)
        self._record = self._observer.request_started(self._clock())
        if msg.request_headers.end_of_stream or self._request_body_mode in (NONE, _Mode.STREAMED):
            return [self._decision_answer("headers", None)]
        if self._request_body_mode == FULL_DUPLEX:
            return []  # the answer waits for the whole body
        return [m.request_headers_response(m.header_mutation((), _STRIP))]

    def _on_request_body(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        chunk = msg.request_body
        data = chunk.body
        if len(self._body) + len(data) > self._settings.max_body_bytes:
            self._body.clear()
            raise EppError(
                ErrorCode.BODY_TOO_LARGE, f"request body exceeds the limit of {self._settings.max_body_bytes} bytes"
            )
        whole: bytes | None = None
        if chunk.end_of_stream and not self._body and self._decision is None:
            whole = data  # the usual one-chunk body: not copied into the buffer and out again
        else:
            self._body += data
        if self._request_body_mode == FULL_DUPLEX:
            return self._finish_duplex(end_of_stream=True, body=whole) if chunk.end_of_stream else []
        if self._decision is not None:  # headers-only decision already made (STREAMED/NONE): pass through
            return [m.request_body_response()]
        return [self._decision_answer("body", whole if whole is not None else bytes(self._body))]

    def _on_request_trailers(self) -> list[m.ProcessingResponse]:
        if self._request_body_mode == FULL_DUPLEX and self._decision is None:
            # The body ended without end_of_stream because trailers follow: decide now, then answer in order.
            return [*self._finish_duplex(end_of_stream=False), m.request_trailers_response()]
        return [m.request_trailers_response()]

    def _finish_duplex(self, end_of_stream: bool, body: bytes | None = None) -> list[m.ProcessingResponse]:
        if body is None:
            body = bytes(self._body)
        headers = self._decision_answer("headers", body)
        decision = self._decision
        out_body = decision.body if decision is not None and decision.body is not None else body
        return [headers, *m.streamed_body_responses(out_body, end_of_stream)]

    def _decision_answer(self, phase: str, body: bytes | None) -> m.ProcessingResponse:
        """Parse, ask the director, and build the answer that carries the decision (on the headers or the body)."""
        started = self._clock()
        headers = self._headers
        request_id = headers.get("x-request-id") or ""
        generated = not request_id
        if generated:
            request_id = uuid.uuid4().hex
        record = self._record
        if record is not None and body is not None:
            record.request_bytes = len(body)
        request = parse_request(request_id, headers.get(":path", "/"), headers, body)
        self._request = request
        decision = self._decider.decide(request, self._subset)
        self._decision = decision
        now = self._clock()
        observer = self._observer
        observer.decision_latency(now - started)
        observer.decided(
            record,
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
            self._rewrite = (
                json.dumps(decision.target_model).encode(),
                json.dumps(decision.original_model).encode(),
            )
        replaced = decision.body if phase == "body" else None
        cacheable = not generated and decision.body is None  # a fresh request id or body length is one request's
        return m.decision_response(phase, set_headers, _STRIP, destination, replaced, cacheable)

    # -- response phase ---------------------------------------------------------------------------------------

    def _on_response_headers(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        headers = m.headers_to_dict(msg.response_headers.headers)
        self._response_sse = "text/event-stream" in headers.get("content-type", "")
        record = self._record
        if record is not None:
            record.response_started_at = self._clock()
            record.streaming = self._response_sse
        decision = self._decision
        if decision is not None:
            served = m.served_endpoint(msg, headers)
            if served is not None and served not in decision.addresses:
                self._observer.served_mismatch()
        if msg.response_headers.end_of_stream:
            self._complete()
        # A model name we put back changes the body's length: let Envoy re-frame it instead of a stale length.
        remove = ("content-length",) if self._rewrite is not None and self._response_body_mode != NONE else ()
        return [m.response_headers_response(m.header_mutation((), remove) if remove else None)]

    def _on_response_body(self, msg: m.ProcessingRequest) -> list[m.ProcessingResponse]:
        chunk = msg.response_body
        body = chunk.body
        if self._record is not None:
            self._observer.response_chunk(self._record, self._clock(), len(body))
        if not self._usage_seen:
            self._read_usage(body, chunk.end_of_stream)
        if self._rewrite is not None:
            body = self._restore_model(body)
        if chunk.end_of_stream:
            self._complete()
        if self._response_body_mode == FULL_DUPLEX:
            return m.streamed_body_responses(body, chunk.end_of_stream, request=False)
        return [m.response_body_response(body if self._rewrite is not None else None)]

    def _restore_model(self, body: bytes) -> bytes:
        assert self._rewrite is not None
        target, original = self._rewrite
        return body.replace(b'"model":' + target, b'"model":' + original).replace(
            b'"model": ' + target, b'"model": ' + original
        )

    def _read_usage(self, body: bytes, end_of_stream: bool) -> None:
        """Token usage from a JSON body or the SSE event that carries `usage` (usually the last).

        Chunks may split an event or a JSON document anywhere, so the unfinished part is carried to the next
        chunk: for SSE only the incomplete last event, for JSON the body so far (up to _MAX_USAGE_BUFFER).
        """
        text = self._response_tail + body
        if self._response_sse:
            if end_of_stream:
                complete, self._response_tail = text, b""
            else:
                head, sep, rest = text.rpartition(b"\n\n")
                complete, self._response_tail = (head, rest) if sep else (b"", text)
                self._response_tail = self._response_tail[-_MAX_USAGE_BUFFER:]
            if b'"usage"' not in complete:
                return
            candidates = [
                line[5:].strip() for line in complete.split(b"\n") if line.startswith(b"data:") and b'"usage"' in line
            ]
        else:
            if not end_of_stream:
                self._response_tail = text if len(text) <= _MAX_USAGE_BUFFER else b""
                return
            self._response_tail = b""
            if b'"usage"' not in text:
                return
            candidates = [text]
        for raw in reversed(candidates):
            try:
                usage = orjson.loads(raw).get("usage")
            except (ValueError, AttributeError):
                continue
            if isinstance(usage, dict):
                self._usage_seen = True
                decision = self._decision
                details = usage.get("prompt_tokens_details")
                cached = details.get("cached_tokens") if isinstance(details, dict) else None
                self._observer.usage(
                    decision.original_model if decision else "",
                    int(usage.get("prompt_tokens") or 0),
                    int(usage.get("completion_tokens") or 0),
                    self._record,
                    cached if isinstance(cached, int) and cached >= 0 else -1,
                )
                return

    # -- endings ----------------------------------------------------------------------------------------------

    def _complete(self) -> None:
        decision = self._decision
        if decision is None:
            return
        self._decision = None
        self._decider.complete(decision)
        self._observer.request_done(None, decision.original_model, decision.target_model, self._record, self._clock())

    def _refuse(self, err: EppError) -> m.ProcessingResponse:
        self.finished = True
        self._body = bytearray()
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
