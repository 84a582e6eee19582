import json

import pytest

from epp.errors import EppError, ErrorCode
from epp.requests import ApiKind, InferenceRequest, parse_request


def _parse(path: str, body: object, headers: dict[str, str] | None = None) -> InferenceRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_request("r1", path, headers or {}, raw)


@pytest.mark.parametrize(
    ("path", "body", "kind"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, ApiKind.CHAT),
        ("/v1/completions", {"model": "m", "prompt": "hi"}, ApiKind.COMPLETIONS),
        ("/v1/embeddings", {"model": "m", "input": ["a", "b"]}, ApiKind.EMBEDDINGS),
        ("/v1/responses", {"model": "m", "input": "hi"}, ApiKind.RESPONSES),
    ],
    ids=["chat", "completions", "embeddings", "responses"],
)
def test_each_api_kind_parses_model_and_prompt(path: str, body: dict[str, object], kind: ApiKind) -> None:
    request = _parse(path, body)
    assert request.api is kind
    assert request.model == "m"
    assert request.prompt


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"\xff\xfe"),
        ("/v1/chat/completions", [1, 2]),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ("/v1/chat/completions", {"model": "m", "messages": []}),
        ("/v1/completions", {"model": "m"}),
        ("/v1/embeddings", {"model": "m"}),
        ("/v1/completions", {"model": 7, "prompt": "x"}),
    ],
    ids=["not-json", "not-utf8", "not-object", "no-model", "empty-messages", "no-prompt", "no-input", "model-not-str"],
)
def test_unroutable_bodies_are_bad_requests(path: str, body: object) -> None:
    with pytest.raises(EppError) as err:
        _parse(path, body)
    assert err.value.code is ErrorCode.BAD_REQUEST
    assert err.value.body.startswith("inference error: BadRequest - ")


def test_bodyless_request_on_other_path_routes_without_model() -> None:
    request = parse_request("r1", "/v1/models", {}, None)
    assert request.api is ApiKind.OTHER
    assert request.model == ""


def test_stream_flag_and_control_headers_are_read() -> None:
    request = _parse(
        "/v1/chat/completions",
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
        {"x-gateway-inference-objective": "critical", "x-session-token": "s1"},
    )
    assert request.stream is True
    assert request.objective == "critical"
    assert request.session_token == "s1"
