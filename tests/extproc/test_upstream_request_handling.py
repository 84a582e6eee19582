"""Request handling as upstream's picker does it (llm-d-router `pkg/epp/handlers/request.go`,
`pkg/epp/framework/common/request/headers.go`, `test/integration/epp/common_tests.go`): the path when `:path` is
missing, a request without a body, SSE usage whose events come without a blank line between chunks. And the seam
those cases go through: the stream asks for its decision with one `NeedDecision`, parsed once."""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from epp.datastore import EndpointTable
from epp.director import Director
from epp.director.decision import NeedDecision
from epp.errors import EppError, ErrorCode
from epp.extproc.response import ResponseTracker
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.requests import ApiKind, ParserChain, UsageDialect, request_path
from epp.scheduling import Scheduler
from tests.extproc.envoy import (
    BODY,
    POOL,
    DecidingStream,
    Mode,
    body_msg,
    config,
    decide_through,
    destination,
    headers_msg,
    immediate,
    make_director,
    make_stream,
)
from tests.support.schedulers import RandomScheduler


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({":path": "/foo", "x-original-path": "/bar"}, "/foo"),
        ({"x-original-path": "/bar", "x-forwarded-path": "/baz"}, "/bar"),
        ({"x-forwarded-path": "/baz"}, "/baz"),
        ({}, "/v1/completions"),
        ({":path": ""}, "/v1/completions"),
    ],
    ids=["path", "x-original-path", "x-forwarded-path", "none", "empty"],
)
def test_the_request_path_falls_back_as_upstreams_does(headers: dict[str, str], expected: str) -> None:
    """headers_test.go TestGetRequestPath: `:path`, then x-original-path, then x-forwarded-path, else completions."""
    assert request_path(headers) == expected


def _headers_without_path(extra: dict[str, str] | None = None) -> pb.ProcessingRequest:
    values = {":method": "POST", "content-type": "application/json", "x-request-id": "r1", **(extra or {})}
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    )
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=header_map))
    msg.protocol_config.CopyFrom(config(Mode.FULL_DUPLEX_STREAMED, Mode.NONE))
    return msg


def test_a_request_without_a_path_is_parsed_as_completions_even_with_an_explicit_parser_list() -> None:
    """Ours took `/`: with `requestHandler.parsers: [openai-parser]` that was 400 "no parser claims the path /"."""
    settings = StreamSettings(parsers=ParserChain(["openai-parser"]))
    stream = DecidingStream(make_director(), PickerMetrics(CollectorRegistry()), lambda: 0.0, settings)
    assert stream.handle(_headers_without_path()) == []
    out = stream.handle(body_msg(json.dumps({"model": "m1", "prompt": "hello"}).encode(), True))
    assert destination(out[0]) in POOL
    assert stream._request is not None and stream._request.api is ApiKind.COMPLETIONS


def test_x_original_path_chooses_the_parser_when_path_is_missing() -> None:
    stream, _, _ = make_stream()
    stream.handle(_headers_without_path({"x-original-path": "/v1/chat/completions"}))
    out = stream.handle(body_msg(BODY, True))
    assert destination(out[0]) in POOL
    assert stream._request is not None and stream._request.api is ApiKind.CHAT


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/models", "/unclaimed"], ids=lambda p: p.strip("/")
)
def test_a_request_without_a_body_is_routed_to_an_endpoint_of_the_pool(path: str) -> None:
    """request.go: headers with end_of_stream go to an endpoint of the pool, whatever the path (ours answered a
    header-only chat POST 400 "chat requests need a JSON body", and an unclaimed path 400 with a parser list)."""
    settings = StreamSettings(parsers=ParserChain(["openai-parser"]))
    stream = DecidingStream(make_director(), PickerMetrics(CollectorRegistry()), lambda: 0.0, settings)
    out = stream.handle(headers_msg(end_of_stream=True, path=path))
    assert [r.WhichOneof("response") for r in out] == ["request_headers"]
    assert destination(out[0]) in POOL


def test_a_request_without_a_body_on_an_empty_pool_gets_upstreams_500() -> None:
    """common_tests.go "no backend pods available": 500 `inference error: Internal - no pods available in
    datastore` for a header-only request when the pool has no endpoint."""
    table = EndpointTable()
    table.synced = True
    stream, _, _ = make_stream(Director(table, Scheduler(RandomScheduler(seed=1)), clock=lambda: 0.0))
    status, body = immediate(stream.handle(headers_msg(end_of_stream=True)))
    assert (status, body) == (500, "inference error: Internal - no pods available in datastore")


def test_a_request_with_a_body_on_an_empty_pool_is_still_503() -> None:
    table = EndpointTable()
    table.synced = True
    stream, _, _ = make_stream(Director(table, Scheduler(RandomScheduler(seed=1)), clock=lambda: 0.0))
    stream.handle(headers_msg())
    status, body = immediate(stream.handle(body_msg(BODY, True)))
    assert status == 503 and body.startswith("inference error: ServiceUnavailable - ")


@pytest.mark.parametrize(
    "chunks",
    [
        [
            b'data: {"choices":[{"text":"a"}]}',
            b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10}}',
            b"data: [DONE]",
        ],
        [
            b'data: {"choices":[{"text":"a"}]}\n',
            b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":10}}\n',
            b"data: [DONE]\n",
        ],
        [
            b'data: {"choices":[{"text":"a"}]}\n\n',
            b'data: {"choices":[],"usage":{"prompt_tokens":7,',
            b'"completion_tokens":10}}\n\ndata: [DONE]\n\n',
        ],
    ],
    ids=["no-newline-between-chunks", "one-newline", "blank-line-framing"],
)
def test_sse_usage_is_read_with_or_without_a_blank_line_between_events(chunks: list[bytes]) -> None:
    """Upstream reads each chunk's `data:` lines on their own; ours joined unframed chunks into one line."""
    tracker = ResponseTracker(True, None, UsageDialect.OPENAI)
    found = [tracker.feed(chunk, i == len(chunks) - 1)[1] for i, chunk in enumerate(chunks)]
    usages = [u for u in found if u is not None]
    assert len(usages) == 1 and usages[0].valid
    assert (usages[0].prompt_tokens, usages[0].completion_tokens) == (7, 10)


def test_the_stream_asks_for_its_decision_once_with_the_request_parsed() -> None:
    """The deciding message gets a `NeedDecision` (nothing answered yet); `resume` answers it with the pipeline's
    decision. Other messages are answered at once."""
    director = make_director()
    stream = DecidingStream(director, PickerMetrics(CollectorRegistry()), lambda: 0.0)
    assert super(DecidingStream, stream).handle(headers_msg()) == []
    need = super(DecidingStream, stream).handle(body_msg(BODY, True))
    assert isinstance(need, NeedDecision)  # the request itself, parsed
    assert need.model == "m1" and need.body_size == len(BODY)
    assert stream.phase.name == "DECIDING"
    out = stream.resume(decide_through(director.pipeline, need, stream.subset))
    assert [r.WhichOneof("response") for r in out] == ["request_headers", "request_body"]
    assert destination(out[0]) in POOL
    assert stream.in_flight
    stream.close()
    assert not stream.in_flight


def test_a_refusal_the_pipeline_leaves_is_answered_by_resume() -> None:
    stream = DecidingStream(make_director(), PickerMetrics(CollectorRegistry()), lambda: 0.0)
    super(DecidingStream, stream).handle(headers_msg())
    need = super(DecidingStream, stream).handle(body_msg(BODY, True))
    assert isinstance(need, NeedDecision)
    refusal = EppError(ErrorCode.RESOURCE_EXHAUSTED, "flow-control queue full", "rejected-capacity")
    status, body = immediate(stream.resume(refusal))
    assert status == 429 and body == "inference error: ResourceExhausted - flow-control queue full"
    assert stream.finished
