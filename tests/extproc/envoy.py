"""What Envoy sends on an ext_proc stream, built as Envoy builds it, and readers for what the picker answers."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2
from prometheus_client import CollectorRegistry

from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Decision, Director
from epp.director.decision import NeedDecision, Outcome, Timing
from epp.director.pipeline import DecisionPipeline
from epp.extproc.messages import MAX_CHUNK
from epp.extproc.stream import StreamProcessor, StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.requests import InferenceRequest
from epp.scheduling import Scheduler
from tests.support.schedulers import RandomScheduler

Mode = processing_mode_pb2.ProcessingMode
POOL = ["127.10.0.1:8000", "127.10.0.2:8000", "127.10.0.3:8000"]
BODY = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "héllo wörld ✓ “quotes” 日本語"}]}).encode()


def make_director(pool: Sequence[str] = POOL, clock: Callable[[], float] = lambda: 0.0) -> Director:
    """A director over `pool` picking at random (seeded), on `clock`."""
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in pool)
    table.synced = True
    return Director(table, Scheduler(RandomScheduler(seed=1)), clock=clock)


class CountingDecider:
    """The test director, counting its decisions and releases (a stream must release every booking it takes)."""

    def __init__(self) -> None:
        self.inner = make_director()
        self.decided = 0
        self.completed = 0

    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision:
        self.decided += 1
        return self.inner.decide(request, subset)

    def complete(self, decision: Decision, timing: Timing | None = None) -> None:
        self.completed += 1
        self.inner.complete(decision, timing)

    def first_byte(self, decision: Decision, timing: Timing | None = None) -> None:
        self.inner.first_byte(decision, timing)


def decide_now(decider: object, request: NeedDecision, subset: Sequence[str] | None) -> Outcome:
    """What the adapter's pipeline does without a render call or flow control: the decider's `decide`, or its
    refusal or failure in place of a decision."""
    try:
        return decider.decide(request, subset)  # type: ignore[attr-defined,no-any-return]
    except Exception as exc:
        return exc


def decide_through(pipeline: DecisionPipeline, request: NeedDecision, subset: Sequence[str] | None) -> Outcome:
    """The pipeline as the adapter runs it when no stage waits (no render call, no flow control): at once."""
    decide = pipeline.immediate
    assert decide is not None, "the pipeline has a stage that waits"
    return decide_now(_Deciding(decide), request, subset)


class _Deciding:
    def __init__(self, decide: object) -> None:
        self.decide = decide


class DecidingStream(StreamProcessor):
    """A stream driven as the adapter drives it, without the adapter: a message that asks for the decision
    (`NeedDecision`) is decided at once by the `decide` of the object the stream was given (which also releases
    its bookings), and the stream resumed with it; `handle` returns every answer of the message."""

    __slots__ = ()

    def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:  # type: ignore[override]
        out = super().handle(msg)
        if isinstance(out, NeedDecision):
            return self.resume(decide_now(self._bookings, out, self.subset))
        return out


def make_stream(
    director: Director | None = None, max_body: int = 1 << 20
) -> tuple[DecidingStream, Director, PickerMetrics]:
    director = director or make_director()
    metrics = PickerMetrics(CollectorRegistry())
    return DecidingStream(director, metrics, lambda: 0.0, StreamSettings(max_body_bytes=max_body)), director, metrics


def inflight(director: Director) -> int:
    return int(director.table.snapshot().inflight.sum())


def config(request_mode: int, response_mode: int = Mode.NONE, early_body: bool = False) -> pb.ProtocolConfiguration:
    return pb.ProtocolConfiguration(
        request_body_mode=request_mode,  # type: ignore[arg-type]
        response_body_mode=response_mode,  # type: ignore[arg-type]
        send_body_without_waiting_for_header_response=early_body,
    )


def headers_msg(
    end_of_stream: bool = False,
    mode: int | None = Mode.FULL_DUPLEX_STREAMED,
    extra: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
    subset: Sequence[str] | None = None,
    response_mode: int | None = None,
    early_body: bool = False,
) -> pb.ProcessingRequest:
    values = {
        ":method": "POST",
        ":path": path,
        "content-type": "application/json",
        "x-request-id": "r1",
        **(extra or {}),
    }
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream))
    if mode is not None:
        msg.protocol_config.CopyFrom(config(mode, mode if response_mode is None else response_mode, early_body))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.fields["x-gateway-destination-endpoint-subset"].list_value.extend(list(subset))
        msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return msg


def body_msg(chunk: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=end_of_stream))


def request_trailers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_headers(content_type: str = "application/json", end_of_stream: bool = False) -> pb.ProcessingRequest:
    header_map = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=content_type.encode()),
        ]
    )
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=header_map, end_of_stream=end_of_stream))


def response_body(chunk: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk, end_of_stream=end_of_stream))


def response_trailers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


def kinds(responses: Sequence[pb.ProcessingResponse]) -> list[str]:
    return [str(r.WhichOneof("response")) for r in responses]


def destination(response: pb.ProcessingResponse) -> str:
    common = getattr(response, response.WhichOneof("response")).response
    values = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    metadata = response.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"]
    assert values["x-gateway-destination-endpoint"] == metadata.string_value
    return metadata.string_value


def streamed_body(responses: Sequence[pb.ProcessingResponse], request: bool = True) -> tuple[bytes, bool]:
    body = b""
    eos = False
    for r in responses:
        assert r.WhichOneof("response") == ("request_body" if request else "response_body")
        part = r.request_body if request else r.response_body
        streamed = part.response.body_mutation.streamed_response
        assert len(streamed.body) <= MAX_CHUNK
        assert not eos, "nothing may follow end_of_stream"
        body += streamed.body
        eos = streamed.end_of_stream
    return body, eos


def immediate(responses: Sequence[pb.ProcessingResponse]) -> tuple[int, str]:
    assert len(responses) == 1 and responses[0].WhichOneof("response") == "immediate_response", kinds(responses)
    r = responses[0].immediate_response
    return r.status.code, r.body.decode()
