"""Request body modes other than upstream's: STREAMED, and bodies the picker cannot read (content-encoding).

Reproduction 12 of the hardening probe: STREAMED body mode refused every chat request with 400, and a gzip body got a
misleading "not valid JSON" reason.
"""

from __future__ import annotations

import gzip

from tests.extproc.envoy import (
    BODY,
    POOL,
    Mode,
    body_msg,
    destination,
    headers_msg,
    immediate,
    inflight,
    kinds,
    make_stream,
    response_headers,
)


def test_streamed_mode_routes_a_chat_request_and_answers_every_chunk() -> None:
    """Envoy waits for the headers answer before it streams the body: the pick is made on the headers, and each
    body chunk then gets its own pass-through answer."""
    stream, director, _ = make_stream()
    out = stream.handle(headers_msg(mode=Mode.STREAMED, response_mode=Mode.NONE))
    assert kinds(out) == ["request_headers"]
    assert destination(out[0]) in POOL
    for i in range(0, len(BODY), 40):
        answer = stream.handle(body_msg(BODY[i : i + 40], i + 40 >= len(BODY)))
        assert kinds(answer) == ["request_body"]
        assert not answer[0].request_body.response.HasField("body_mutation")
    assert inflight(director) == 1
    assert kinds(stream.handle(response_headers(end_of_stream=True))) == ["response_headers"]
    assert inflight(director) == 0


def test_streamed_mode_with_early_body_buffers_decides_on_the_body_then_answers_in_order() -> None:
    """With `send_body_without_waiting_for_header_response`, Envoy streams chunks before the headers answer: the
    picker holds every answer, decides on the whole body, and answers headers, then one answer per chunk."""
    stream, director, _ = make_stream()
    assert stream.handle(headers_msg(mode=Mode.STREAMED, response_mode=Mode.NONE, early_body=True)) == []
    assert stream.handle(body_msg(BODY[:30], False)) == []
    assert stream.handle(body_msg(BODY[30:60], False)) == []
    out = stream.handle(body_msg(BODY[60:], True))
    assert kinds(out) == ["request_headers", "request_body", "request_body", "request_body"]
    assert destination(out[0]) in POOL
    assert inflight(director) == 1


def test_a_compressed_body_is_refused_with_a_reason_that_says_so() -> None:
    stream, _, _ = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED, extra={"content-encoding": "gzip"}))
    status, reason = immediate(stream.handle(body_msg(gzip.compress(BODY), True)))
    assert status in (400, 415)
    assert "content-encoding" in reason and "gzip" in reason


def test_chat_messages_that_are_not_objects_are_refused() -> None:
    stream, _, _ = make_stream()
    stream.handle(headers_msg(mode=Mode.BUFFERED))
    status, reason = immediate(stream.handle(body_msg(b'{"model": "m1", "messages": [1, 2]}', True)))
    assert status == 400 and "messages" in reason
