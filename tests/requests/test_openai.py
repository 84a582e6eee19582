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


UPSTREAM_NAMES = {
    "x-llm-d-inference-objective": "new-objective",
    "x-llm-d-inference-fairness-id": "tenant-a",
    "x-llm-d-model-name-rewrite": "base-v2",
    "x-llm-d-slo-ttft-ms": "250",
    "x-llm-d-slo-tpot-ms": "20.5",
}
OLD_NAMES = {
    "x-gateway-inference-objective": "old-objective",
    "x-gateway-inference-fairness-id": "tenant-old",
    "x-gateway-model-name-rewrite": "base-old",
    "x-slo-ttft-ms": "900",
    "x-slo-tpot-ms": "90",
}
BODY = {"model": "m", "prompt": "p"}


def _control(request: InferenceRequest) -> tuple[object, ...]:
    return (
        request.objective,
        request.fairness_id,
        request.model_rewrite,
        request.slo_ttft_ms,
        request.slo_tpot_ms,
    )


@pytest.mark.parametrize("body", [BODY, None], ids=["with-body", "headers-only"])
def test_upstreams_current_header_names_are_read_first_and_the_old_ones_are_aliases(body: object) -> None:
    path = "/v1/completions" if body else "/v1/models"
    raw = json.dumps(body).encode() if body else None

    def parse(headers: dict[str, str]) -> InferenceRequest:
        return parse_request("r1", path, headers, raw)

    assert _control(parse({**OLD_NAMES, **UPSTREAM_NAMES})) == ("new-objective", "tenant-a", "base-v2", 250.0, 20.5)
    assert _control(parse(OLD_NAMES)) == ("old-objective", "tenant-old", "base-old", 900.0, 90.0)
    assert _control(parse({})) == (None,) * 5


@pytest.mark.parametrize("name", [*UPSTREAM_NAMES, *OLD_NAMES, "x-session-token"])
def test_each_control_header_is_read_when_it_is_the_only_one_among_ordinary_headers(name: str) -> None:
    """The all-absent shortcut (a set test over the header names) misses none of the eleven names."""
    value = {**UPSTREAM_NAMES, **OLD_NAMES, "x-session-token": "s9"}[name]
    headers = {":path": "/v1/completions", "content-type": "application/json", "x-request-id": "r", name: value}
    request = parse_request("r1", "/v1/completions", headers, json.dumps(BODY).encode())
    read = {*_control(request), request.session_token} - {None}
    assert read == {float(value) if name.endswith("-ms") else value}
    ordinary = {k: v for k, v in headers.items() if k != name}
    assert _control(parse_request("r1", "/v1/completions", ordinary, json.dumps(BODY).encode())) == (None,) * 5


def test_an_slo_header_that_is_no_positive_number_counts_as_absent() -> None:
    for value in ("soon", "-5", "0", "inf", ""):
        assert _parse("/v1/completions", BODY, {"x-llm-d-slo-ttft-ms": value}).slo_ttft_ms is None
