"""Message orders Envoy should not send: each gets a clear answer or is ignored, never a doubled or stray answer.

Reproductions 9 (a stream that decides twice leaks an in-flight booking) and 10 (unexpected orders got unrequested
or doubled answers) of the hardening probe.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from tests.extproc.envoy import (
    BODY,
    CountingDecider,
    Mode,
    body_msg,
    headers_msg,
    immediate,
    inflight,
    kinds,
    make_stream,
    request_trailers,
    response_body,
    response_headers,
    response_trailers,
)


def _run(messages: Sequence[pb.ProcessingRequest]) -> tuple[list[list[pb.ProcessingResponse]], CountingDecider]:
    from prometheus_client import CollectorRegistry

    from epp.observability.metrics import PickerMetrics
    from tests.extproc.envoy import DecidingStream

    counting = CountingDecider()
    stream = DecidingStream(counting, PickerMetrics(CollectorRegistry()), lambda: 0.0)  # type: ignore[arg-type]
    answers = [stream.handle(msg) for msg in messages]
    stream.close()
    return answers, counting


_DUPLEX_BODY_ENDS_TWICE = [headers_msg(), body_msg(BODY, True), body_msg(BODY, True)]
_BUFFERED_BODY_TWICE = [headers_msg(mode=Mode.BUFFERED), body_msg(BODY, False), body_msg(BODY, True)]
_HEADERS_ONLY_TWICE = [headers_msg(end_of_stream=True, path="/v1/models")] * 2
_TRAILERS_AFTER_RESPONSE = [
    headers_msg(path="/v1/models"),
    body_msg(b"", True),
    response_headers(end_of_stream=True),
    request_trailers(),
]


@pytest.mark.parametrize(
    "messages",
    [_DUPLEX_BODY_ENDS_TWICE, _BUFFERED_BODY_TWICE, _HEADERS_ONLY_TWICE, _TRAILERS_AFTER_RESPONSE],
    ids=["duplex-body-ends-twice", "buffered-body-twice", "headers-only-twice", "trailers-after-the-response"],
)
def test_a_stream_decides_at_most_once_and_its_booking_always_returns(messages: list[pb.ProcessingRequest]) -> None:
    """Reproduction 9: the second decision overwrote the first and its in-flight booking was never released."""
    _, counting = _run(messages)
    assert counting.decided <= 1
    assert counting.completed == counting.decided
    assert inflight(counting.inner) == 0


def test_a_body_before_the_headers_is_refused_clearly() -> None:
    """Reproduction 10: a body with no headers was decided with an empty path and answered as if valid."""
    stream, director, _ = make_stream()
    status, body = immediate(stream.handle(body_msg(BODY, True)))
    assert status == 400 and "request_body" in body and "before" in body
    assert stream.handle(headers_msg()) == []
    assert inflight(director) == 0


@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED], ids=["buffered", "duplex"])
def test_second_request_headers_are_refused_not_answered_twice(mode: int) -> None:
    """Reproduction 10: a second request_headers got a second headers answer."""
    stream, director, _ = make_stream()
    stream.handle(headers_msg(mode=mode))
    status, body = immediate(stream.handle(headers_msg(mode=mode)))
    assert status == 400 and "request_headers" in body
    assert inflight(director) == 0


def test_response_before_the_request_was_decided_is_refused() -> None:
    """Reproduction 10: FULL_DUPLEX holds the headers answer; a response_headers answer overtook it."""
    stream, director, _ = make_stream()
    assert stream.handle(headers_msg()) == []
    status, body = immediate(stream.handle(response_headers()))
    assert status == 400 and "response_headers" in body
    assert inflight(director) == 0


def test_a_response_body_after_the_response_ended_is_refused_once_and_then_ignored() -> None:
    stream, director, _ = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED, response_mode=Mode.STREAMED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers())
    assert kinds(stream.handle(response_body(b"{}", True))) == ["response_body"]
    assert immediate(stream.handle(response_body(b"{}", True)))[0] == 400
    assert stream.handle(response_body(b"{}", True)) == []
    assert inflight(director) == 0


def test_buffered_trailers_before_the_body_are_refused_not_left_undecided() -> None:
    """Reproduction 10: the trailers were answered and the request went on with no decision at all."""
    stream, director, _ = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED, path="/v1/models"))
    status, body = immediate(stream.handle(request_trailers()))
    assert status == 400 and "request_trailers" in body
    assert inflight(director) == 0


def test_valid_full_sequence_answers_each_message_once_in_order() -> None:
    stream, director, _ = make_stream()
    answers = [
        stream.handle(msg)
        for msg in (
            headers_msg(),
            body_msg(BODY[:5], False),
            body_msg(BODY[5:], False),
            request_trailers(),
            response_headers("text/event-stream"),
            response_body(b"data: {}\n\n", False),
            response_body(b"data: [DONE]\n\n", False),
            response_trailers(),
        )
    ]
    assert answers[0] == [] and answers[1] == [] and answers[2] == []
    assert kinds(answers[3]) == ["request_headers", "request_body", "request_trailers"]
    assert [kinds(a) for a in answers[4:]] == [
        ["response_headers"],
        ["response_body"],
        ["response_body"],
        ["response_trailers"],
    ]
    assert inflight(director) == 0
