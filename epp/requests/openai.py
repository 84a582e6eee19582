"""Parse OpenAI-style request bodies (chat completions, completions, embeddings, responses).

The picker needs only a few things from a body: the model to route, the text whose leading blocks decide prefix-cache
affinity, and whether the answer streams. Everything else in the body is passed through untouched.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from epp import wire
from epp.errors import EppError, ErrorCode

HEADER_OBJECTIVE, _OLD_OBJECTIVE = wire.OBJECTIVE_HEADERS
HEADER_FAIRNESS, _OLD_FAIRNESS = wire.FAIRNESS_HEADERS
HEADER_MODEL_REWRITE, _OLD_MODEL_REWRITE = wire.MODEL_REWRITE_HEADERS
HEADER_SESSION = "x-session-token"

# Limits on what a body may be, each refused with a 400 that names it (the body's size is `--max-body-bytes`, 413):
MAX_NESTING = 128  # arrays/objects inside one another; real bodies (tool schemas included) stay under 30
MAX_MODEL_CHARS = 1024  # the longest model names in use are ~100 characters


class ApiKind(enum.Enum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    EMBEDDINGS = "embeddings"
    RESPONSES = "responses"
    MESSAGES = "messages"  # Anthropic Messages API (epp.requests.anthropic)
    GENERATE = "generate"  # vLLM's /inference/v1/generate (epp.requests.vllm)
    OTHER = "other"


class UsageDialect(enum.Enum):
    """How the response reports token usage, so the response tracker reads the right fields."""

    OPENAI = "openai"  # usage.prompt_tokens / completion_tokens, JSON or the SSE chunk that carries it
    ANTHROPIC = "anthropic"  # usage.input_tokens / output_tokens; SSE message_start + message_delta
    NONE = "none"  # not read (passthrough)


_PATH_SUFFIXES: tuple[tuple[str, ApiKind], ...] = (
    ("/chat/completions", ApiKind.CHAT),
    ("/completions", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/responses", ApiKind.RESPONSES),
)


_KIND_OF_PATH: dict[str, ApiKind] = {}  # paths repeat (a handful of API routes): memo, bounded below


def api_kind_of_path(path: str) -> ApiKind:
    """The API a request targets, from its `:path` (query string ignored)."""
    kind = _KIND_OF_PATH.get(path)
    if kind is None:
        kind = ApiKind.OTHER
        stripped = path.split("?", 1)[0].rstrip("/")
        for suffix, candidate in _PATH_SUFFIXES:
            if stripped.endswith(suffix):
                kind = candidate
                break
        if len(_KIND_OF_PATH) >= 1024:  # query strings make paths unbounded
            _KIND_OF_PATH.clear()
        _KIND_OF_PATH[path] = kind
    return kind


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class InferenceRequest(NamedTuple):
    """What the decision reads about one request. Immutable: the director derives new values (`_replace`).

    A NamedTuple rather than a frozen dataclass: one is built per request, and a frozen dataclass's `__init__`
    sets each of its twelve fields through `object.__setattr__`, about 1.5 µs more on the hot path.
    """

    request_id: str
    api: ApiKind
    model: str
    prompt: str = ""
    stream: bool = False
    objective: str | None = None
    fairness_id: str | None = None
    session_token: str | None = None
    model_rewrite: str | None = None
    headers: Mapping[str, str] = _NO_HEADERS
    body: dict[str, Any] | None = None
    body_size: int = 0
    max_output_tokens: int | None = None  # the body's max_tokens (Anthropic, vLLM generate), when it gives one
    usage: UsageDialect = UsageDialect.OPENAI
    slo_ttft_ms: float | None = None  # x-llm-d-slo-ttft-ms (alias x-slo-ttft-ms); a value that is no number: None
    slo_tpot_ms: float | None = None  # x-llm-d-slo-tpot-ms (alias x-slo-tpot-ms)
    # The engine's token ids of the prompt: the body's own (vLLM generate) or those a vllm token-producer's render
    # call returned (epp.director.tokens, as `TokenIds`: one uint32 buffer); None: not known, scheduling estimates
    # (4 bytes per token).
    token_ids: Sequence[int] | None = None
    no_body: bool = False  # the request has no body at all (request headers with end_of_stream)
    queued_s: float = 0.0  # seconds it waited in flow control's queue (set by the pipeline; its route receipt's)


class ControlHeaders(NamedTuple):
    """The request-control headers, each read by upstream's current name first, then its older alias."""

    objective: str | None
    fairness_id: str | None
    session_token: str | None
    model_rewrite: str | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None


def _milliseconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


# Every header `control_headers` reads. A request that carries none of them (most do not) gets the one answer of
# all None, from a C-speed set test instead of eleven lookups: the set's own `isdisjoint` over the header names (the
# dict's keys view swaps the two and builds an iterator of its own, ~1k instructions more).
_CONTROL_NAMES = frozenset(
    (
        *wire.OBJECTIVE_HEADERS,
        *wire.FAIRNESS_HEADERS,
        HEADER_SESSION,
        *wire.MODEL_REWRITE_HEADERS,
        *wire.SLO_TTFT_HEADERS,
        *wire.SLO_TPOT_HEADERS,
    )
)
_NO_CONTROL = ControlHeaders(None, None, None, None, None, None)


def control_headers(headers: Mapping[str, str]) -> ControlHeaders:
    if _CONTROL_NAMES.isdisjoint(headers):
        return _NO_CONTROL
    get = headers.get
    return ControlHeaders(
        objective=get(HEADER_OBJECTIVE) or get(_OLD_OBJECTIVE) or None,
        fairness_id=get(HEADER_FAIRNESS) or get(_OLD_FAIRNESS) or None,
        session_token=get(HEADER_SESSION) or None,
        model_rewrite=get(HEADER_MODEL_REWRITE) or get(_OLD_MODEL_REWRITE) or None,
        slo_ttft_ms=_milliseconds(get(wire.SLO_TTFT_HEADERS[0]) or get(wire.SLO_TTFT_HEADERS[1])),
        slo_tpot_ms=_milliseconds(get(wire.SLO_TPOT_HEADERS[0]) or get(wire.SLO_TPOT_HEADERS[1])),
    )


def _text_of_content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def _chat_prompt(messages: list[Any]) -> str:
    """The prompt of a list of message objects; 400 when an entry is not an object (checked in the same pass)."""
    # Role markers keep two conversations with the same words in other roles from sharing a prefix.
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            raise _bad("each entry of 'messages' must be an object")
        content = m.get("content")
        parts.append(f"<{m.get('role', '')}>{content if isinstance(content, str) else _text_of_content(content)}")
    return "".join(parts)


def _input_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return "".join(value)
        if all(isinstance(v, dict) for v in value):
            return _chat_prompt(value)
        return json.dumps(value, separators=(",", ":"))
    return ""


def _bad(message: str) -> EppError:
    return EppError(ErrorCode.BAD_REQUEST, message)


def _nesting_depth(value: object, limit: int) -> int:
    """How deep arrays and objects nest in `value` (a scalar is 0), counted without recursion; stops past `limit`.

    Iterative on purpose: every later step that walks a body (prompt text, re-serialising a rewritten body) would
    otherwise recurse once per level, and a 2 KB body nested 1,000 deep hit Python's recursion limit (a 500).
    """
    if not isinstance(value, (dict, list)):
        return 0
    deepest = 0
    stack: list[tuple[dict[Any, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return deepest


def opening_brackets(body: bytes) -> int:
    """How many `[` and `{` bytes `body` holds (inside strings too): the length the two deletions took away.

    `bytes.replace` finds a single byte with `memchr` and copies the runs between with `memcpy`, so a body with
    few brackets costs a few hundred instructions; a `translate` or `count` pass tests every byte (~10k
    instructions for a 750-byte chat body, counted by `benchmarks/stream_path.py --instructions`).
    """
    return len(body) - len(body.replace(b"[", b"").replace(b"{", b""))


def _check_nesting(body: bytes, parsed: dict[str, Any]) -> None:
    # Nesting needs brackets: a body with at most MAX_NESTING of them (most bodies) cannot be too deep, and
    # counting them is a C-speed scan; only the rest are walked.
    if opening_brackets(body) > MAX_NESTING and _nesting_depth(parsed, MAX_NESTING) > MAX_NESTING:
        raise _bad(f"nesting too deep (more than {MAX_NESTING} levels of arrays and objects)")


def _prompt_of(api: ApiKind, body: dict[str, Any]) -> str:
    if api is ApiKind.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("chat completions need a non-empty 'messages' list")
        return _chat_prompt(messages)
    if api is ApiKind.COMPLETIONS:
        if "prompt" not in body or body["prompt"] in (None, "", []):
            raise _bad("completions need a 'prompt'")
        return _input_text(body["prompt"])
    if api in (ApiKind.EMBEDDINGS, ApiKind.RESPONSES):
        if "input" not in body or body["input"] in (None, "", []):
            raise _bad(f"{api.value} need an 'input'")
        text = _input_text(body["input"])
        instructions = body.get("instructions")
        return f"{instructions}{text}" if isinstance(instructions, str) else text
    return ""


def json_object_body(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """The body as a JSON object, every parser's first step; 400s for a compressed, invalid or too deep body."""
    encoding = headers.get("content-encoding")
    if encoding and encoding.strip().lower() != "identity":
        raise _bad(f"the body has content-encoding {encoding}; the picker reads only uncompressed JSON bodies")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        reason = str(exc).split(":", 1)[0]
        if "depth" in reason or "ecursion" in reason:  # orjson's own limit (1,024 levels)
            raise _bad(f"nesting too deep (more than {MAX_NESTING} levels of arrays and objects)") from None
        raise _bad(f"body is not valid JSON ({reason})") from None
    if not isinstance(parsed, dict):
        raise _bad("body must be a JSON object")
    _check_nesting(body, parsed)
    return parsed


def model_of(parsed: Mapping[str, Any], required: bool) -> str:
    """The body's `model` ("" when absent and not required); 400 when it is not a usable name."""
    model = parsed.get("model")
    if model is None and not required:
        return ""
    if not isinstance(model, str) or not model:
        raise _bad("'model' is missing or not a string")
    if len(model) > MAX_MODEL_CHARS:
        raise _bad(f"'model' is longer than {MAX_MODEL_CHARS} characters")
    return model


def request_without_body(
    request_id: str, path: str, headers: Mapping[str, str], no_body: bool = False
) -> InferenceRequest:
    """A request routed on its headers alone: a pool-level pick, no model.

    For requests that have no body (e.g. `GET /v1/models`, `no_body`), and for those whose body the gateway does
    not show the picker before it must answer (ext_proc body modes NONE and STREAMED).
    """
    control = control_headers(headers)
    return InferenceRequest(
        request_id=request_id,
        api=api_kind_of_path(path),
        model="",
        objective=control.objective,
        fairness_id=control.fairness_id,
        session_token=control.session_token,
        model_rewrite=control.model_rewrite,
        headers=headers,
        slo_ttft_ms=control.slo_ttft_ms,
        slo_tpot_ms=control.slo_tpot_ms,
        no_body=no_body,
    )


def parse_request(request_id: str, path: str, headers: Mapping[str, str], body: bytes | None) -> InferenceRequest:
    """Parse one request; raises EppError(BAD_REQUEST) with a short reason when the body cannot be routed.

    A request without a body (e.g. `GET /v1/models`) is routed with a pool-level pick and an empty model.
    """
    api = api_kind_of_path(path)
    if not body:
        if api is ApiKind.OTHER:
            return request_without_body(request_id, path, headers)
        raise _bad(f"{api.value} requests need a JSON body")
    control = control_headers(headers)
    parsed = json_object_body(headers, body)
    model = model_of(parsed, required=api is not ApiKind.OTHER)
    return InferenceRequest(
        request_id=request_id,
        api=api,
        model=model,
        prompt=_prompt_of(api, parsed),
        stream=parsed.get("stream") is True,
        objective=control.objective,
        fairness_id=control.fairness_id,
        session_token=control.session_token,
        model_rewrite=control.model_rewrite,
        headers=headers,
        body=parsed,
        body_size=len(body),
        slo_ttft_ms=control.slo_ttft_ms,
        slo_tpot_ms=control.slo_tpot_ms,
    )
