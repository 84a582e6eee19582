"""The picker's own answer (`Answer`, e.g. `GET /v1/models` with --serve-models-list): the stream ends with a 200
ImmediateResponse carrying the body and its content type, counted a success, nothing booked; without the answer
stage the same request is routed to an endpoint as before."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from epp.director.decision import Answer
from epp.extproc.phases import Phase
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import POOL, DecidingStream, Mode, destination, headers_msg, make_director

LISTED = b'{"object":"list","data":[{"id":"m1","object":"model","created":0,"owned_by":"default/pool"}]}'


def _stream(answering: bool) -> tuple[DecidingStream, PickerMetrics, object]:
    director = make_director()
    pipeline = director.pipeline
    if answering:
        pipeline = pipeline.answering(lambda r: Answer(LISTED) if r.headers.get(":path") == "/v1/models" else None)
    metrics = PickerMetrics(CollectorRegistry())

    class _Decider:
        decide = pipeline.immediate
        complete = pipeline.complete

    return DecidingStream(_Decider(), metrics, lambda: 0.0, StreamSettings()), metrics, director


@pytest.mark.parametrize(
    "mode",
    [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED, Mode.NONE, Mode.STREAMED],
    ids=["duplex", "buffered", "none", "streamed"],
)
def test_an_answer_ends_the_stream_with_200_its_body_and_content_type(mode: int) -> None:
    stream, metrics, director = _stream(True)
    out = stream.handle(headers_msg(end_of_stream=True, mode=mode, path="/v1/models", extra={":method": "GET"}))
    assert len(out) == 1 and out[0].WhichOneof("response") == "immediate_response"
    answer = out[0].immediate_response
    assert answer.status.code == 200
    assert answer.body == LISTED
    headers = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    assert headers["content-type"] == "application/json"
    assert stream.phase is Phase.FINISHED and not stream.in_flight
    assert int(director.table.snapshot().inflight.sum()) == 0  # type: ignore[attr-defined]
    assert stream.handle(headers_msg()) == []  # a finished stream answers nothing more
    stream.close()
    assert metrics.activity == 1  # counted once, as a request that ended


def test_without_the_answer_stage_the_same_request_goes_to_an_endpoint() -> None:
    stream, _, _ = _stream(False)
    out = stream.handle(headers_msg(end_of_stream=True, path="/v1/models", extra={":method": "GET"}))
    assert [r.WhichOneof("response") for r in out] == ["request_headers"]
    assert destination(out[0]) in POOL


def test_other_requests_without_a_body_are_still_picked_with_the_answer_stage() -> None:
    stream, _, _ = _stream(True)
    out = stream.handle(headers_msg(end_of_stream=True, path="/v1/completions"))
    assert destination(out[0]) in POOL
