"""Token usage from model-server responses: odd values are ignored and counted, the response itself passes intact.

Reproduction 6 of the hardening probe: odd `usage` counts turned a good BUFFERED 200 into a 500 and truncated a
FULL_DUPLEX response.
"""

from __future__ import annotations

import json

import pytest

from tests.extproc.envoy import (
    BODY,
    Mode,
    body_msg,
    headers_msg,
    inflight,
    kinds,
    make_stream,
    response_body,
    response_headers,
    streamed_body,
)

_ODD_USAGE = {
    "negative": {"prompt_tokens": -5, "completion_tokens": 2},
    "float": {"prompt_tokens": 1.5, "completion_tokens": 2},
    "string": {"prompt_tokens": "many", "completion_tokens": 2},
    "numeric-string": {"prompt_tokens": "7", "completion_tokens": 2},
    "huge": {"prompt_tokens": 10**30, "completion_tokens": 2},
    "nested-object": {"prompt_tokens": {"n": 1}, "completion_tokens": 2},
    "list": {"prompt_tokens": [1], "completion_tokens": 2},
    "bool": {"prompt_tokens": True, "completion_tokens": 2},
    "usage-is-a-list": [1, 2],
    "usage-is-a-string": "lots",
}
_ODD_RAW = {"overflowing-float": b'{"usage": {"prompt_tokens": 1e400, "completion_tokens": 2}}'}


def _bodies() -> list[tuple[str, bytes]]:
    out = [(name, json.dumps({"choices": [], "usage": usage}).encode()) for name, usage in _ODD_USAGE.items()]
    return out + list(_ODD_RAW.items())


@pytest.mark.parametrize(("name", "payload"), _bodies(), ids=[n for n, _ in _bodies()])
def test_odd_usage_keeps_a_buffered_200_a_200_and_is_counted(name: str, payload: bytes) -> None:
    """BUFFERED request, response body STREAMED (as the shipped gateway config asks): the answer passes the body."""
    stream, director, metrics = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED, response_mode=Mode.STREAMED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers())
    out = stream.handle(response_body(payload, True))
    assert kinds(out) == ["response_body"]
    assert not out[0].response_body.response.HasField("body_mutation")
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_input_tokens_count", {"model_name": "m1", "target_model_name": "m1"}
        )
        is None
    )
    assert metrics.registry.get_sample_value("epp_response_usage_invalid_total") == 1.0
    assert inflight(director) == 0


@pytest.mark.parametrize(("name", "payload"), _bodies(), ids=[n for n, _ in _bodies()])
def test_odd_usage_never_truncates_a_full_duplex_response(name: str, payload: bytes) -> None:
    stream, director, metrics = make_stream()
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers("text/event-stream"))
    chunks = [b'data: {"choices":[]}\n\n', b"data: " + payload + b"\n\n", b"data: [DONE]\n\n"]
    echoed = [stream.handle(response_body(c, i == 2)) for i, c in enumerate(chunks)]
    assert b"".join(streamed_body(out, request=False)[0] for out in echoed) == b"".join(chunks)
    assert streamed_body(echoed[-1], request=False)[1]
    assert metrics.registry.get_sample_value("epp_response_usage_invalid_total") == 1.0
    assert inflight(director) == 0


def test_good_usage_split_across_chunks_is_read_once() -> None:
    stream, _, metrics = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED, response_mode=Mode.STREAMED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers())
    payload = b'{"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}'
    for i in range(0, len(payload), 9):
        stream.handle(response_body(payload[i : i + 9], i + 9 >= len(payload)))
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_input_tokens_sum", {"model_name": "m1", "target_model_name": "m1"}
        )
        == 11.0
    )
    assert (
        metrics.registry.get_sample_value(
            "inference_objective_output_tokens_count", {"model_name": "m1", "target_model_name": "m1"}
        )
        == 1.0
    )
    assert metrics.registry.get_sample_value("epp_response_usage_invalid_total") == 0.0


class _FailingRelease:
    """A director whose release fails: a bug in the picker while the response is under way."""

    def __init__(self) -> None:
        from tests.extproc.envoy import make_director

        self.inner = make_director()

    def decide(self, request, subset=None):  # type: ignore[no-untyped-def]
        return self.inner.decide(request, subset)

    def complete(self, decision, timing=None) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("bug")

    def first_byte(self, decision, timing=None) -> None:  # type: ignore[no-untyped-def]
        self.inner.first_byte(decision, timing)


def test_a_failure_of_the_picker_in_the_response_lets_the_chunk_through_unchanged() -> None:
    from prometheus_client import CollectorRegistry

    from epp.observability.metrics import PickerMetrics
    from tests.extproc.envoy import DecidingStream

    stream = DecidingStream(_FailingRelease(), PickerMetrics(CollectorRegistry()), lambda: 0.0)  # type: ignore[arg-type]
    stream.handle(headers_msg())
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers("text/event-stream"))
    out = stream.handle(response_body(b"data: [DONE]\n\n", True))
    assert streamed_body(out, request=False) == (b"data: [DONE]\n\n", True)
