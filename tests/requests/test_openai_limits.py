"""Parse limits: deep nesting and oversized fields are clear 400s, never a 500 with an ERROR traceback.

Reproduction kept from the hardening probe: a 2 KB body nesting arrays ~1,000 deep in `prompt`, `role` or
`input` hit Python's recursion limit, answered 500 and logged an ERROR traceback per request (one client produced
1.27 MB/s of ERROR log).
"""

from __future__ import annotations

import json
import logging

import pytest

from epp.errors import EppError, ErrorCode
from epp.requests import parse_request
from epp.requests.openai import MAX_MODEL_CHARS, MAX_NESTING, opening_brackets
from tests.extproc.envoy import body_msg, headers_msg, immediate, make_stream

DEEP = "[" * 1000 + "]" * 1000  # the probe's depth: ~2 KB of brackets

DEEP_BODIES = {
    "prompt": ("/v1/completions", '{"model":"m","prompt":[1,' + DEEP + "]}"),
    "role": ("/v1/chat/completions", '{"model":"m","messages":[{"role":' + DEEP + ',"content":"hi"}]}'),
    "input": ("/v1/responses", '{"model":"m","input":[1,' + DEEP + "]}"),
    "content": ("/v1/chat/completions", '{"model":"m","messages":[{"role":"user","content":' + DEEP + "}]}"),
    "tools": ("/v1/chat/completions", '{"model":"m","messages":[{"role":"u","content":"x"}],"tools":' + DEEP + "}"),
    "beyond-json-parser": ("/v1/completions", '{"model":"m","prompt":' + "[" * 5000 + "]" * 5000 + "}"),
}


@pytest.mark.parametrize("field", list(DEEP_BODIES))
def test_a_deeply_nested_body_is_a_400_that_says_so(field: str) -> None:
    """Depth ~1,000 in prompt/role/input (the probe's 2 KB bodies) and elsewhere: 400 "nesting too deep"."""
    path, body = DEEP_BODIES[field]
    with pytest.raises(EppError) as err:
        parse_request("r1", path, {}, body.encode())
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert "nesting too deep" in err.value.message and str(MAX_NESTING) in err.value.message


def test_nesting_up_to_the_limit_is_accepted() -> None:
    schema: object = {"type": "string"}
    for _ in range(MAX_NESTING - 3):  # the body, the tools list and the innermost schema make 3 levels
        schema = {"items": schema}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [schema]}
    assert parse_request("r1", "/v1/chat/completions", {}, json.dumps(body).encode()).model == "m"
    too_deep = {**body, "tools": [{"items": schema}]}
    with pytest.raises(EppError, match="nesting too deep"):
        parse_request("r1", "/v1/chat/completions", {}, json.dumps(too_deep).encode())


def _nested(depth: int, kinds: str) -> str:
    """A JSON value `depth` levels deep, its containers taken in turn from `kinds` ("[" arrays, "{" objects)."""
    text = "1"
    for level in range(depth):
        text = f"[{text}]" if kinds[level % len(kinds)] == "[" else f'{{"k":{text}}}'
    return text


@pytest.mark.parametrize("kinds", ["[", "{", "[{", "{[", "[[{"])
def test_the_limit_is_exact_for_arrays_objects_and_both(kinds: str) -> None:
    """MAX_NESTING levels pass, one more is the 400, whichever containers make them (the body is one level)."""
    for depth, refused in ((MAX_NESTING - 1, False), (MAX_NESTING, True)):
        body = ('{"model":"m","prompt":"hi","extra":' + _nested(depth, kinds) + "}").encode()
        assert opening_brackets(body) == depth + 1
        if refused:
            with pytest.raises(EppError, match="nesting too deep"):
                parse_request("r1", "/v1/completions", {}, body)
        else:
            assert parse_request("r1", "/v1/completions", {}, body).model == "m"


def test_brackets_inside_strings_count_for_the_pre_check_but_not_for_depth() -> None:
    """A prompt of 1,000 `[` and `{` characters: past the byte count, so the body is walked, and found shallow."""
    prompt = "[{" * 500
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}]}).encode()
    assert opening_brackets(body) == 1_003
    request = parse_request("r1", "/v1/chat/completions", {}, body)
    assert request.prompt == "<user>" + prompt


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b"[", b"{", b"[[{{", b'{"a":"[{[{"}', bytes(range(256)) * 3, b"x" * 10_000 + b"[" * 300 + b"{"],
)
def test_opening_brackets_counts_every_bracket_byte(body: bytes) -> None:
    assert opening_brackets(body) == body.count(b"[") + body.count(b"{")


def test_many_brackets_without_depth_are_fine() -> None:
    body = {"model": "m", "prompt": [[1, 2]] * 500}  # 501 brackets, depth 3
    assert parse_request("r1", "/v1/completions", {}, json.dumps(body).encode()).model == "m"


def test_an_overlong_model_name_is_a_400() -> None:
    body = {"model": "m" * (MAX_MODEL_CHARS + 1), "prompt": "hi"}
    with pytest.raises(EppError, match=f"longer than {MAX_MODEL_CHARS}"):
        parse_request("r1", "/v1/completions", {}, json.dumps(body).encode())
    body["model"] = "m" * MAX_MODEL_CHARS
    assert parse_request("r1", "/v1/completions", {}, json.dumps(body).encode()).model == body["model"]


@pytest.mark.parametrize("field", ["prompt", "role", "input"])
def test_the_stream_answers_400_and_logs_no_error(field: str, caplog: pytest.LogCaptureFixture) -> None:
    """Through the ext_proc stream: the probe saw a 500 and an ERROR traceback per request."""
    path, body = DEEP_BODIES[field]
    stream, director, _ = make_stream()
    with caplog.at_level(logging.DEBUG):
        stream.handle(headers_msg(path=path))
        status, text = immediate(stream.handle(body_msg(body.encode(), True)))
    assert status == 400 and "nesting too deep" in text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert int(director.table.snapshot().inflight.sum()) == 0
