"""Readers of what Envoy sends (the header map as the request's headers) and the streamed body answers."""

from __future__ import annotations

import pytest
from envoy.config.core.v3 import base_pb2

from epp.extproc.messages import MAX_CHUNK, headers_to_dict, streamed_body_responses


def _map(*headers: base_pb2.HeaderValue) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=list(headers))


def test_raw_values_are_read_as_text_in_order() -> None:
    header_map = _map(
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
        base_pb2.HeaderValue(key="x-llm-d-inference-objective", raw_value="caf\u00e9".encode()),
    )
    assert list(headers_to_dict(header_map).items()) == [
        (":path", "/v1/chat/completions"),
        ("x-llm-d-inference-objective", "caf\u00e9"),
    ]


def test_an_older_envoy_value_is_read_when_raw_value_is_empty() -> None:
    header_map = _map(base_pb2.HeaderValue(key="a", value="old"), base_pb2.HeaderValue(key="b", raw_value=b"new"))
    assert headers_to_dict(header_map) == {"a": "old", "b": "new"}


def test_a_value_that_is_not_utf8_has_its_bad_bytes_replaced_and_loses_no_header() -> None:
    header_map = _map(
        base_pb2.HeaderValue(key="a", raw_value=b"ok"),
        base_pb2.HeaderValue(key="b", raw_value=b"bad \xff\xfe end"),
        base_pb2.HeaderValue(key="c", value="old"),
    )
    assert headers_to_dict(header_map) == {"a": "ok", "b": "bad \ufffd\ufffd end", "c": "old"}


def test_a_repeated_header_keeps_its_last_value_and_an_empty_map_is_empty() -> None:
    header_map = _map(base_pb2.HeaderValue(key="a", raw_value=b"1"), base_pb2.HeaderValue(key="a", raw_value=b"2"))
    assert headers_to_dict(header_map) == {"a": "2"}
    assert headers_to_dict(base_pb2.HeaderMap()) == {}


@pytest.mark.parametrize("size", [0, 1, MAX_CHUNK, MAX_CHUNK + 1, 2 * MAX_CHUNK, 2 * MAX_CHUNK + 5])
@pytest.mark.parametrize("end_of_stream", [True, False])
@pytest.mark.parametrize("request_side", [True, False])
def test_a_streamed_body_goes_back_whole_in_chunks_with_eos_on_the_last_only(
    size: int, end_of_stream: bool, request_side: bool
) -> None:
    body = bytes(i % 251 for i in range(size))
    answers = streamed_body_responses(body, end_of_stream, request=request_side)
    assert len(answers) == max(1, -(-size // MAX_CHUNK))
    chunks = []
    for i, answer in enumerate(answers):
        assert answer.WhichOneof("response") == ("request_body" if request_side else "response_body")
        side = answer.request_body if request_side else answer.response_body
        assert side.response.body_mutation.HasField("streamed_response")  # present even when empty
        streamed = side.response.body_mutation.streamed_response
        assert len(streamed.body) <= MAX_CHUNK
        assert streamed.end_of_stream is (end_of_stream and i == len(answers) - 1)
        chunks.append(streamed.body)
    assert b"".join(chunks) == body
