"""vLLM's own generate API (`/inference/v1/generate`): a pre-tokenized prompt, parsed as upstream's
`vllmhttp-parser` parses it (llm-d-router `pkg/epp/framework/plugins/requesthandling/parsers/vllmhttp`).

The body must carry a non-empty `token_ids` list (a 400 otherwise, as upstream); `model` is optional, `stream` and
`sampling_params.max_tokens` are read. The token ids become the prompt text for prefix affinity one character per
token (ids past the UTF-16 surrogate block shifted over it, so every id has its own code point): two requests
sharing leading tokens share leading characters, and the prefix hash sees the same block boundaries for both.
The response reports usage as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.requests.openai import (
    ApiKind,
    InferenceRequest,
    UsageDialect,
    _bad,
    json_object_body,
    model_of,
    request_without_body,
)

GENERATE_PATH = "inference/v1/generate"
_SURROGATES = 0xD800
_MAX_ID = 0x10FFFF - 0x800  # the largest id that still maps to a code point


def _token_text(ids: list[int]) -> str:
    return "".join(chr(t if t < _SURROGATES else t + 0x800) for t in ids)


def parse_generate(request_id: str, path: str, headers: Mapping[str, str], body: bytes | None) -> InferenceRequest:
    """One generate request; raises EppError(BAD_REQUEST) with the reason when it cannot be routed."""
    if not body:
        raise _bad("generate requests need a JSON body")
    parsed = json_object_body(headers, body)
    ids = parsed.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise _bad("generate requests need a non-empty 'token_ids' list")
    if not all(type(t) is int and 0 <= t <= _MAX_ID for t in ids):
        raise _bad("'token_ids' must be non-negative integers")
    sampling = parsed.get("sampling_params")
    max_tokens = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    return request_without_body(request_id, path, headers)._replace(
        api=ApiKind.GENERATE,
        model=model_of(parsed, required=False),
        prompt=_token_text(ids),
        stream=parsed.get("stream") is True,
        body=parsed,
        body_size=len(body),
        max_output_tokens=max_tokens if type(max_tokens) is int and max_tokens >= 0 else None,
        usage=UsageDialect.OPENAI,
        token_ids=tuple(ids),
    )
