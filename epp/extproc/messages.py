"""Builders for the ext_proc responses the picker sends, and readers for what Envoy sends.

Kept apart from the state machine so that the protobuf shapes (which field carries what) live in one place.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Protocol, cast

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2

from epp import wire
from epp.errors import EppError


class _HeaderReader(Protocol):
    """The compiled reader (epp/extproc/_headers.pyi)."""

    ENABLED: int

    def header_dict(self, data: bytes) -> dict[str, str] | None: ...


_reader: _HeaderReader | None
try:  # built at install when a compiler is there (setup.py); without it upb's wrappers are read
    _reader = cast(_HeaderReader, importlib.import_module("epp.extproc._headers"))
except ImportError:
    _reader = None
_COMPILED = _reader if _reader is not None and _reader.ENABLED else None

MAX_CHUNK = 62_000  # Envoy's limit for one streamed body message is 64 KiB; upstream sends 62,000-byte chunks.
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
# Headers a client may send that only the picker (or the gateway) may set: removed from the forwarded request.
STRIP = tuple(h for h in wire.ROUTING_HEADERS if h != wire.DESTINATION_HEADER)

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse
HeaderMutation = pb.HeaderMutation

# The body modes of `protocol_config` (ProcessingMode.BodySendMode) the stream tells apart.
_Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _Mode.FULL_DUPLEX_STREAMED
BUFFERED = _Mode.BUFFERED
STREAMED = _Mode.STREAMED
NONE = _Mode.NONE


def headers_to_dict(header_map: base_pb2.HeaderMap) -> dict[str, str]:
    """`headers_to_dict_upb`, read by the compiled reader from the map's bytes when it was built (one upb encode
    and one call instead of ~40 upb attribute reads for ~10 headers); the definition runs where it answers None."""
    if _COMPILED is not None:
        found = _COMPILED.header_dict(header_map.SerializeToString())
        if found is not None:
            return found
    return headers_to_dict_upb(header_map)


def headers_to_dict_upb(header_map: base_pb2.HeaderMap) -> dict[str, str]:
    """The definition. Envoy sends values in `raw_value` (bytes) in current versions and `value` in older ones;
    read both.

    Names are lower-cased by Envoy already; a repeated header keeps its last value, which is all we read. A value
    that is not UTF-8 is read with its bad bytes replaced (U+FFFD).
    """
    # A slice is a plain list: iterating the repeated field itself ends in an IndexError that upb formats (~2k
    # instructions per map), and decode() without arguments skips looking up the codec and the error handler
    # by name (~0.3k per header). Both counted by `benchmarks/stream_path.py --instructions`.
    headers = header_map.headers[:]
    try:
        return {h.key: h.raw_value.decode() or h.value for h in headers}
    except UnicodeDecodeError:
        return {h.key: h.raw_value.decode("utf-8", "replace") or h.value for h in headers}


def subset_hint(request: pb.ProcessingRequest) -> list[str] | None:
    """The gateway's endpoint subset, if its filter metadata carries one; None when absent."""
    if not request.HasField("metadata_context"):
        return None
    namespace = request.metadata_context.filter_metadata.get(wire.SUBSET_NAMESPACE)
    if namespace is None or wire.SUBSET_KEY not in namespace.fields:
        return None
    value = namespace.fields[wire.SUBSET_KEY]
    if value.HasField("list_value"):
        return [v.string_value for v in value.list_value.values if v.string_value]
    if value.HasField("string_value"):  # tolerate a comma-separated string
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def served_endpoint(request: pb.ProcessingRequest, headers: dict[str, str] | None = None) -> str | None:
    """The endpoint the gateway reports as having served the request (metadata, or a response header)."""
    if request.HasField("metadata_context"):
        lb = request.metadata_context.filter_metadata.get(wire.LB_NAMESPACE)
        if lb is not None and wire.DESTINATION_SERVED_HEADER in lb.fields:
            return lb.fields[wire.DESTINATION_SERVED_HEADER].string_value or None
    if headers:
        return headers.get(wire.DESTINATION_SERVED_HEADER)
    return None


def header_mutation(set_headers: Iterable[tuple[str, str]], remove: Sequence[str] = ()) -> pb.HeaderMutation:
    mutation = pb.HeaderMutation(remove_headers=remove)
    for key, value in set_headers:
        option = mutation.set_headers.add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = _OVERWRITE
    return mutation


def decision_metadata(
    response: pb.ProcessingResponse,
    destination: str,
    scores: tuple[tuple[str, float], ...] = (),
    receipt: str | None = None,
    entries: bytes = b"",
) -> None:
    """Write the decision into dynamic metadata `envoy.lb` (Envoy drops it unless the filter lists the namespace);
    with scores (--emit-endpoint-scores), also the struct address → score under DESTINATION_SCORES_KEY; with a
    route receipt (--emit-route-receipts), its JSON under ROUTE_RECEIPT_KEY; `entries`: more of the struct's entries
    as a Struct's bytes (a route receipt's, written by its own compiled call: `lb_entries_python`'s), merged in
    last."""
    struct = response.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value
    fields = struct.fields
    if destination:  # "": already written (a copy of an answer that has it)
        fields[wire.DESTINATION_HEADER].string_value = destination
    if scores:
        by_address = fields[wire.DESTINATION_SCORES_KEY].struct_value.fields
        for address, score in scores:
            by_address[address].number_value = score
    if receipt:
        fields[wire.ROUTE_RECEIPT_KEY].string_value = receipt
    if entries:
        struct.MergeFromString(entries)


def lb_entries_python(scores: tuple[tuple[str, float], ...], receipt: str | None) -> bytes:
    """The definition of a route receipt's `envoy.lb` entries as bytes (`epp.scheduling.receipt`'s compiled account
    writes them so, for the answer to copy): the scores struct and the receipt as `decision_metadata` writes them,
    without the destination, as the bytes of that Struct."""
    response = pb.ProcessingResponse()
    decision_metadata(response, "", scores, receipt)
    entries: bytes = response.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.SerializeToString()
    return entries


class _Compiled(Protocol):
    """The extension's function (epp/extproc/_metadata.pyi)."""

    ENABLED: int

    def lb_metadata(self, *fields: object) -> object: ...


_built: _Compiled | None
try:
    _built = cast(_Compiled, importlib.import_module("epp.extproc._metadata"))
except ImportError:  # built without a compiler: the Python code runs
    _built = None
_METADATA: _Compiled | None = _built if _built is not None and _built.ENABLED else None


_LB, _DESTINATION = wire.LB_NAMESPACE, wire.DESTINATION_HEADER
_SCORES, _RECEIPT = wire.DESTINATION_SCORES_KEY, wire.ROUTE_RECEIPT_KEY


def _lb_bytes(
    native: _Compiled,
    prefix: bytes | None,
    destination: str,
    scores: tuple[tuple[str, float], ...],
    receipt: str | None,
    entries: bytes = b"",
) -> object:
    """The compiled call with the wire names (`prefix`: an answer's bytes to append the metadata to, or None)."""
    return native.lb_metadata(
        prefix,
        wire.LB_NAMESPACE,
        wire.DESTINATION_HEADER,
        destination,
        wire.DESTINATION_SCORES_KEY,
        scores,
        wire.ROUTE_RECEIPT_KEY,
        receipt,
        entries,
    )


def write_metadata(
    response: pb.ProcessingResponse,
    destination: str,
    scores: tuple[tuple[str, float], ...],
    receipt: str | None,
    entries: bytes = b"",
) -> None:
    """`decision_metadata`, compiled when it can be: the whole `envoy.lb` struct (the destination too) as wire bytes
    in one call, merged in (its entry replaces the one a copied answer has), where the scores struct costs a upb map
    write per endpoint."""
    if _METADATA is not None:
        raw = _lb_bytes(_METADATA, None, destination, scores, receipt, entries)
        if raw.__class__ is bytes:
            response.dynamic_metadata.MergeFromString(raw)
            return
    decision_metadata(response, destination, scores, receipt, entries)


class EncodedAnswer:
    """An answer held as its wire bytes: what both fronts write is `SerializeToString()`, which gives them back, so
    an answer whose bytes are built in C (`with_metadata`) is neither parsed nor encoded again (~40k instructions a
    request with receipts on). Any other read (tests, a debugging caller) parses the bytes once and reads the
    message: it stands in for the `ProcessingResponse` they encode, equal to it."""

    __slots__ = ("_message", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._message: pb.ProcessingResponse | None = None

    def SerializeToString(self) -> bytes:
        return self.raw

    def message(self) -> pb.ProcessingResponse:
        """The answer parsed (once)."""
        parsed = self._message
        if parsed is None:
            parsed = self._message = pb.ProcessingResponse.FromString(self.raw)
        return parsed

    def __getattr__(self, name: str) -> object:
        return getattr(self.message(), name)

    def __eq__(self, other: object) -> bool:
        return bool(self.message() == (other.message() if isinstance(other, EncodedAnswer) else other))

    __hash__ = None  # type: ignore[assignment]  # as a message's: mutable, not hashable


def serialize(response: pb.ProcessingResponse | EncodedAnswer) -> bytes:
    """An answer's bytes (grpc.aio's response serializer: the generated one accepts messages only)."""
    return response.SerializeToString()


def with_metadata(
    raw: bytes, destination: str, scores: tuple[tuple[str, float], ...], receipt: str | None, entries: bytes = b""
) -> pb.ProcessingResponse | None:
    """The answer serialized as `raw` with `write_metadata`'s metadata, as one buffer built in one C call and kept as
    bytes (`EncodedAnswer`: cheaper than copying the message, whose upb copy serializes and parses, or than parsing
    the buffer); None without the compiled code. Typed as the message it stands in for."""
    native = _METADATA
    if native is None:
        return None
    # `_lb_bytes`, inlined: every answer with scores or a receipt comes here (each bytecode ~100 instructions)
    whole = native.lb_metadata(raw, _LB, _DESTINATION, destination, _SCORES, scores, _RECEIPT, receipt, entries)
    return EncodedAnswer(whole) if whole.__class__ is bytes else None


# Builders fill messages through attribute paths: with the upb backend that writes in place, where nested
# constructor arguments would copy each sub-message.


def request_headers_response(
    mutation: pb.HeaderMutation | None = None, clear_route_cache: bool = False
) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse()
    common = response.request_headers.response
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
    if clear_route_cache:
        common.clear_route_cache = True
    return response


def request_body_response(
    mutation: pb.HeaderMutation | None = None, body: bytes | None = None, clear_route_cache: bool = False
) -> pb.ProcessingResponse:
    """BUFFERED mode: the answer to the whole body, optionally carrying the decision and a replaced body."""
    response = pb.ProcessingResponse()
    common = response.request_body.response
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
    if body is not None:
        common.body_mutation.body = body
    if clear_route_cache:
        common.clear_route_cache = True
    if mutation is None and body is None:
        response.request_body.SetInParent()
    return response


def request_body_chunk_response(body: bytes | None, replace: bool) -> pb.ProcessingResponse:
    """STREAMED: the answer to one body chunk; `replace` puts `body` in its place (None: the chunk is dropped)."""
    response = pb.ProcessingResponse()
    common = response.request_body.response
    if not replace:
        response.request_body.SetInParent()
    elif body is None:
        common.body_mutation.clear_body = True
    else:
        common.body_mutation.body = body
    return response


_ONE_CHUNK = (0,)


def streamed_body_responses(body: bytes, end_of_stream: bool, request: bool = True) -> list[pb.ProcessingResponse]:
    """FULL_DUPLEX_STREAMED: the body sent back in chunks of at most MAX_CHUNK bytes; the last carries eos."""
    size = len(body)
    # One chunk (the usual body, and an empty one) without building a range: ~1.8k instructions a request.
    starts = range(0, size, MAX_CHUNK) if size > MAX_CHUNK else _ONE_CHUNK
    last = starts[-1]
    out = []
    for start in starts:
        response = pb.ProcessingResponse()
        body_response = response.request_body if request else response.response_body
        streamed = body_response.response.body_mutation.streamed_response
        streamed.body = body[start : start + MAX_CHUNK] if size > MAX_CHUNK else body
        if end_of_stream and start == last:
            streamed.end_of_stream = True
        else:
            streamed.SetInParent()
        out.append(response)
    return out


class DecisionAnswers:
    """The answers that carry a decision, built once per distinct decision and handed out again.

    Such an answer (on the request headers, or BUFFERED on the body) sets the routing headers, removes the headers
    only the picker may set, writes the destination into `envoy.lb` metadata and clears the route cache. It depends
    only on those values, and requests to the same endpoint repeat them, so the answer is built and serialized once
    and the same `EncodedAnswer` is handed out again: the fronts write `SerializeToString()`, which then costs
    nothing (a message's encode costs ~15k instructions a request), and no caller mutates one. Answers with a
    replaced body, or headers unique to one request (`cacheable` False), are built each time. The memo is bounded;
    when full it starts over. One instance per server, shared by its streams.
    """

    __slots__ = ("_answers", "_encoded", "_limit", "_raw", "_remove", "pass_through_headers")

    def __init__(self, remove: Sequence[str] = STRIP, limit: int = 4096) -> None:
        self._answers: dict[tuple[str, tuple[tuple[str, str], ...], str], pb.ProcessingResponse] = {}
        self._raw: dict[tuple[str, tuple[tuple[str, str], ...], str], bytes] = {}  # the answers' bytes
        self._encoded: dict[tuple[str, tuple[tuple[str, str], ...], str], EncodedAnswer] = {}  # handed out as such
        self._limit = limit
        self._remove = tuple(remove)
        # BUFFERED: the headers go on at once, the picker's own routing headers removed.
        self.pass_through_headers = request_headers_response(header_mutation((), self._remove))

    def decision(
        self,
        phase: str,
        set_headers: tuple[tuple[str, str], ...],
        destination: str,
        body: bytes | None = None,
        cacheable: bool = True,
        scores: tuple[tuple[str, float], ...] = (),
        receipt: str | None = None,
        entries: bytes = b"",
    ) -> pb.ProcessingResponse | EncodedAnswer:
        """The answer on the request headers (`phase` "headers") or, BUFFERED, on the body; `scores` and `receipt`
        go into the `envoy.lb` metadata (a request's own: the memoized answer's bytes with the metadata's appended,
        parsed in one call (`with_metadata`), or a copy with them written in; cheaper than building the header
        mutation again). `entries`: the receipt's entries already written as bytes (`decision_metadata`), given with
        the `receipt` they hold, which is then not written again."""
        cacheable = cacheable and body is None
        if cacheable:
            key = (phase, set_headers, destination)
            if not scores and not receipt:  # `entries` come with a receipt
                encoded = self._encoded.get(key)
                if encoded is not None:
                    return encoded
            cached = self._answers.get(key)
            if cached is None:
                cached = self._build(phase, set_headers, destination, None)
                if len(self._answers) >= self._limit:
                    self._answers.clear()
                    self._raw.clear()
                    self._encoded.clear()
                self._answers[key] = cached
            raw = self._raw.get(key)
            if raw is None:
                raw = self._raw[key] = cached.SerializeToString()
            if not scores and not receipt:
                encoded = self._encoded[key] = EncodedAnswer(raw)
                return encoded
            if entries:
                receipt = None  # written with them
            parsed = with_metadata(raw, destination, scores, receipt, entries)
            if parsed is not None:
                return parsed
            response = pb.ProcessingResponse()
            response.CopyFrom(cached)
            write_metadata(response, destination, scores, receipt, entries)
            return response
        response = self._build(phase, set_headers, destination, body)
        if scores or receipt:
            write_metadata(response, destination, scores, None if entries else receipt, entries)
        return response

    def _build(
        self, phase: str, set_headers: tuple[tuple[str, str], ...], destination: str, body: bytes | None
    ) -> pb.ProcessingResponse:
        mutation = header_mutation(set_headers, self._remove)
        if phase == "headers":
            response = request_headers_response(mutation, clear_route_cache=True)
        else:
            response = request_body_response(mutation, body, clear_route_cache=True)
        decision_metadata(response, destination)
        return response


def request_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_headers_response(mutation: pb.HeaderMutation | None = None) -> pb.ProcessingResponse:
    common = pb.CommonResponse()
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=common))


def response_body_response(body: bytes | None = None) -> pb.ProcessingResponse:
    """BUFFERED response mode: pass through, or replace the body."""
    common = pb.CommonResponse()
    if body is not None:
        common.body_mutation.body = body
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))


def response_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def hold_response(seconds: float) -> pb.ProcessingResponse:
    """Asks Envoy to wait `seconds` more for the answer to the message it is waiting on (its per-message timer
    restarts; honoured up to the filter's `max_message_timeout`). Not an answer: the message still gets one."""
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(round(seconds * 1000))
    return pb.ProcessingResponse(override_message_timeout=timeout)


def _refusal_headers(error: EppError) -> list[tuple[str, str]]:
    headers = [("content-type", "text/plain; charset=utf-8")]
    if error.dropped_reason:  # upstream's reason header, on the refusals it gives one for
        headers.append((wire.DROPPED_REASON_HEADER, error.dropped_reason))
    return headers


def immediate_response(error: EppError) -> pb.ProcessingResponse:
    """The clear HTTP answer Envoy sends the client instead of forwarding the request."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.code.http_status),
            headers=header_mutation(_refusal_headers(error)),
            body=error.body.encode(),
            details=f"epp_{error.code.label}",
        )
    )


def ok_response(body: bytes, content_type: str) -> pb.ProcessingResponse:
    """The picker's own answer to a request (`epp.director.decision.Answer`): 200 with `body`."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=http_status_pb2.OK),
            headers=header_mutation((("content-type", content_type),)),
            body=body,
            details="epp_answered",
        )
    )
