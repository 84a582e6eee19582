"""Readers of what Envoy sends: the header map as the request's headers."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2

from epp.extproc.messages import headers_to_dict


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
