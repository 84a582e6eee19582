"""The ext_proc stream state machine, message by message, in every phase order Envoy can send."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Decision, Director
from epp.director.decision import NeedDecision, Timing
from epp.errors import ErrorCode
from epp.extproc.server import ExternalProcessor
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.requests import InferenceRequest
from epp.scheduling import Scheduler
from tests.extproc.envoy import (
    BODY,
    POOL,
    DecidingStream,
    Mode,
    body_msg,
    decide_through,
    destination,
    headers_msg,
    immediate,
    make_director,
    make_stream,
    response_body,
    response_headers,
    streamed_body,
)
from tests.support.schedulers import RandomScheduler


def test_full_duplex_holds_headers_until_the_body_ends_then_answers_in_order() -> None:
    stream, director, _ = make_stream()
    assert stream.handle(headers_msg()) == []
    assert stream.handle(body_msg(BODY[:10], False)) == []
    out = stream.handle(body_msg(BODY[10:], True))
    assert out[0].WhichOneof("response") == "request_headers"
    assert out[0].request_headers.response.clear_route_cache
    assert destination(out[0]) in POOL
    assert streamed_body(out[1:]) == (BODY, True)
    assert int(director.table.snapshot().inflight.sum()) == 1


@pytest.mark.parametrize("split", range(1, len(BODY)), ids=lambda i: f"at-{i}")
def test_full_duplex_body_split_anywhere_is_reassembled(split: int) -> None:
    """Every split point, including inside multi-byte UTF-8 sequences and inside JSON strings."""
    stream, _, _ = make_stream()
    stream.handle(headers_msg())
    assert stream.handle(body_msg(BODY[:split], False)) == []
    out = stream.handle(body_msg(BODY[split:], True))
    assert destination(out[0]) in POOL
    assert streamed_body(out[1:]) == (BODY, True)


def test_full_duplex_three_way_splits_and_empty_end_of_stream_chunk() -> None:
    for a in range(0, len(BODY), 7):
        for b in range(a, len(BODY), 11):
            stream, _, _ = make_stream()
            stream.handle(headers_msg())
            for piece in (BODY[:a], BODY[a:b], BODY[b:]):
                assert stream.handle(body_msg(piece, False)) == []
            out = stream.handle(body_msg(b"", True))
            assert streamed_body(out[1:]) == (BODY, True)


def test_full_duplex_with_trailers_decides_on_trailers_and_answers_headers_body_trailers() -> None:
    stream, _, _ = make_stream()
    stream.handle(headers_msg())
    assert stream.handle(body_msg(BODY, False)) == []
    out = stream.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    kinds = [r.WhichOneof("response") for r in out]
    assert kinds[0] == "request_headers" and kinds[-1] == "request_trailers"
    assert streamed_body(out[1:-1]) == (BODY, False)


def test_large_body_goes_back_in_chunks_of_at_most_62000_bytes() -> None:
    big = json.dumps({"model": "m1", "prompt": "x" * 200_000}).encode()
    stream, _, _ = make_stream()
    stream.handle(headers_msg(path="/v1/completions"))
    out = stream.handle(body_msg(big, True))
    assert len(out) == 1 + 4
    assert streamed_body(out[1:]) == (big, True)


def test_buffered_mode_passes_headers_through_and_decides_on_the_body() -> None:
    stream, _, _ = make_stream()
    first = stream.handle(headers_msg(mode=Mode.BUFFERED))
    assert [r.WhichOneof("response") for r in first] == ["request_headers"]
    removed = list(first[0].request_headers.response.header_mutation.remove_headers)
    assert "x-gateway-destination-endpoint-subset" in removed
    out = stream.handle(body_msg(BODY, True))
    assert [r.WhichOneof("response") for r in out] == ["request_body"]
    assert destination(out[0]) in POOL
    assert out[0].request_body.response.clear_route_cache


def test_without_protocol_config_the_default_is_buffered() -> None:
    stream, _, _ = make_stream()
    assert [r.WhichOneof("response") for r in stream.handle(headers_msg(mode=None))] == ["request_headers"]
    assert destination(stream.handle(body_msg(BODY, True))[0]) in POOL


@pytest.mark.parametrize(
    "mode", [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED, Mode.NONE], ids=["duplex", "buffered", "none"]
)
def test_header_only_request_is_decided_at_once(mode: int) -> None:
    stream, _, _ = make_stream()
    out = stream.handle(headers_msg(end_of_stream=True, mode=mode, path="/v1/models"))
    assert [r.WhichOneof("response") for r in out] == ["request_headers"]
    assert destination(out[0]) in POOL


def test_client_sent_routing_headers_are_overwritten_and_removed() -> None:
    stream, _, _ = make_stream()
    forged = {"x-gateway-destination-endpoint": "127.99.0.1:1", "x-gateway-destination-endpoint-subset": "127.99.0.1:1"}
    out = stream.handle(headers_msg(end_of_stream=True, extra=forged, path="/v1/models"))
    mutation = out[0].request_headers.response.header_mutation
    option = next(h for h in mutation.set_headers if h.header.key == "x-gateway-destination-endpoint")
    assert option.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert option.header.raw_value.decode() in POOL
    assert "x-gateway-destination-endpoint-subset" in mutation.remove_headers


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (["127.10.0.2:8000"], "127.10.0.2:8000"),
        (["127.10.0.2:9999", "127.10.0.3:8000"], "127.10.0.3:8000"),
    ],
    ids=["one", "port-matters"],
)
def test_subset_hint_narrows_the_pick(subset: list[str], expected: str) -> None:
    for _ in range(5):
        stream, _, _ = make_stream()
        out = stream.handle(headers_msg(end_of_stream=True, subset=subset, path="/v1/models"))
        assert destination(out[0]) == expected


@pytest.mark.parametrize("subset", [[], ["127.10.0.2:9999"]], ids=["empty", "no-match"])
def test_subset_hint_with_no_eligible_endpoint_is_503(subset: list[str]) -> None:
    stream, _, _ = make_stream()
    status, body = immediate(stream.handle(headers_msg(end_of_stream=True, subset=subset, path="/v1/models")))
    assert status == 503 and body.startswith("inference error: ServiceUnavailable - ")


def test_body_over_the_limit_is_413_and_the_stream_ends() -> None:
    stream, director, _ = make_stream(max_body=100)
    stream.handle(headers_msg())
    status, body = immediate(stream.handle(body_msg(b"x" * 101, False)))
    assert status == 413 and "100 bytes" in body
    assert stream.finished
    assert stream.handle(body_msg(b"x", True)) == []
    assert int(director.table.snapshot().inflight.sum()) == 0


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"{", 400), (b"[]", 400), (json.dumps({"model": "m"}).encode(), 400)],
    ids=["truncated", "array", "no-messages"],
)
def test_unroutable_body_is_answered_with_its_status(body: bytes, status: int) -> None:
    stream, _, _ = make_stream()
    stream.handle(headers_msg())
    assert immediate(stream.handle(body_msg(body, True)))[0] == status


class _Exploding:
    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision:
        raise RuntimeError("bug")

    def complete(self, decision: Decision, timing: Timing | None = None) -> None:
        raise AssertionError("nothing was decided")


def test_a_bug_in_the_decider_becomes_a_500_not_a_broken_stream() -> None:
    metrics = PickerMetrics(CollectorRegistry())
    stream = DecidingStream(_Exploding(), metrics, lambda: 0.0)  # type: ignore[arg-type]
    status, body = immediate(stream.handle(headers_msg(end_of_stream=True, path="/v1/models")))
    assert status == 500 and body.startswith("inference error: Internal - ")


def test_unknown_message_kind_is_refused_clearly() -> None:
    stream, _, _ = make_stream()
    assert immediate(stream.handle(pb.ProcessingRequest()))[0] == 400


def test_streamed_sse_response_passes_through_untouched_and_usage_is_read() -> None:
    stream, director, metrics = make_stream()
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    assert [r.WhichOneof("response") for r in stream.handle(response_headers("text/event-stream"))] == [
        "response_headers"
    ]
    chunks = [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":',
        b'7,"completion_tokens":2}}\n\ndata: [DONE]\n\n',
    ]
    echoed = b""
    for i, chunk in enumerate(chunks):
        out = stream.handle(response_body(chunk, i == len(chunks) - 1))
        echoed += b"".join(r.response_body.response.body_mutation.streamed_response.body for r in out)
    assert echoed == b"".join(chunks)
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_output_tokens_sum", {"model_name": "m1", "target_model_name": "m1"}
        )
        == 2.0
    )
    assert int(director.table.snapshot().inflight.sum()) == 0


def test_buffered_json_response_usage_is_read_and_in_flight_released() -> None:
    stream, director, metrics = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers("application/json"))
    out = stream.handle(response_body(b'{"usage": {"prompt_tokens": 5, "completion_tokens": 9}}', True))
    assert [r.WhichOneof("response") for r in out] == ["response_body"]
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_input_tokens_sum", {"model_name": "m1", "target_model_name": "m1"}
        )
        == 5.0
    )
    assert int(director.table.snapshot().inflight.sum()) == 0


def test_closing_the_stream_early_releases_the_in_flight_booking_once() -> None:
    stream, director, _ = make_stream()
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    assert int(director.table.snapshot().inflight.sum()) == 1
    stream.close()
    stream.close()
    assert int(director.table.snapshot().inflight.sum()) == 0


class _Rewriting:
    """A director that rewrites the model, as the scheduling work's rewrite rules do."""

    def __init__(self) -> None:
        self.inner = make_director()

    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision:
        decision = self.inner.decide(request, subset)
        assert request.body is not None
        body = json.dumps({**request.body, "model": "m1-lora"}).encode()
        return decision._replace(body=body, target_model="m1-lora")

    def complete(self, decision: Decision, timing: Timing | None = None) -> None:
        self.inner.complete(decision, timing)

    def first_byte(self, decision: Decision, timing: Timing | None = None) -> None:
        self.inner.first_byte(decision, timing)


def test_model_rewrite_resends_the_new_body_with_its_length_and_restores_the_name_in_the_response() -> None:
    stream = DecidingStream(_Rewriting(), PickerMetrics(CollectorRegistry()), lambda: 0.0)  # type: ignore[arg-type]
    stream.handle(headers_msg())
    out = stream.handle(body_msg(BODY, True))
    sent, _ = streamed_body(out[1:])
    assert json.loads(sent)["model"] == "m1-lora"
    lengths = [
        h.header.raw_value
        for h in out[0].request_headers.response.header_mutation.set_headers
        if h.header.key == "content-length"
    ]
    assert lengths == [str(len(sent)).encode()]
    removed = stream.handle(response_headers("application/json"))[
        0
    ].response_headers.response.header_mutation.remove_headers
    assert "content-length" in removed
    answer: Any = stream.handle(response_body(b'{"model":"m1-lora","choices":[]}', True))
    assert answer[0].response_body.response.body_mutation.streamed_response.body == b'{"model":"m1","choices":[]}'


def test_refusal_codes_map_to_http_statuses() -> None:
    assert {c.http_status for c in ErrorCode} == {400, 412, 413, 429, 500, 503}


def _one_endpoint_server() -> ExternalProcessor:
    table = EndpointTable()
    table.replace_all([EndpointInfo(address=POOL[0])])
    table.synced = True
    director = Director(table, Scheduler(RandomScheduler(seed=1)), clock=lambda: 0.0)
    return ExternalProcessor(director, PickerMetrics(CollectorRegistry()), StreamSettings())


def _decision_answer(server: ExternalProcessor, extra: dict[str, str] | None = None) -> pb.ProcessingResponse:
    stream = server.new_stream()
    assert stream.handle(headers_msg(extra=extra)) == []
    need = stream.handle(body_msg(BODY, True))
    assert isinstance(need, NeedDecision)
    answer = stream.resume(decide_through(server.pipeline, need, stream.subset))[0]
    stream.close()
    return answer


def test_requests_to_the_same_endpoint_share_one_prebuilt_decision_answer() -> None:
    server = _one_endpoint_server()
    first, second = _decision_answer(server), _decision_answer(server)
    assert first is second  # built once: grpc serializes it per write, nobody mutates it
    assert destination(first) == POOL[0]


def test_each_server_keeps_its_own_prebuilt_answers() -> None:
    assert _decision_answer(_one_endpoint_server()) is not _decision_answer(_one_endpoint_server())


def test_a_generated_request_id_is_never_shared_between_requests() -> None:
    server = _one_endpoint_server()
    first, second = _decision_answer(server, {"x-request-id": ""}), _decision_answer(server, {"x-request-id": ""})
    ids = [
        {h.header.key: h.header.raw_value for h in r.request_headers.response.header_mutation.set_headers}[
            "x-request-id"
        ]
        for r in (first, second)
    ]
    assert first is not second and ids[0] != ids[1]


def test_the_first_response_chunk_releases_the_prefill_booking_and_the_end_releases_the_rest() -> None:
    stream, director, _ = make_stream()
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    snapshot = director.table.snapshot()
    assert int(snapshot.prefill_tokens.sum()) > 0 and int(snapshot.inflight.sum()) == 1
    stream.handle(response_headers("text/event-stream"))
    assert int(director.table.snapshot().prefill_tokens.sum()) > 0  # headers come before the first token
    stream.handle(response_body(b'data: {"choices": [{"text": "a"}]}\n\n', False))
    snapshot = director.table.snapshot()
    assert int(snapshot.prefill_tokens.sum()) == 0 and int(snapshot.inflight.sum()) == 1
    stream.handle(response_body(b"data: [DONE]\n\n", True))
    snapshot = director.table.snapshot()
    assert int(snapshot.prefill_tokens.sum()) == 0 and int(snapshot.inflight.sum()) == 0
