"""Anthropic Messages API bodies (`/v1/messages`) parsed into the same small value as an OpenAI body.

What the decision reads, as upstream's `anthropic-parser` reads it (llm-d-router
`pkg/epp/framework/plugins/requesthandling/parsers/anthropic`): `model`, the `system` prompt and the `messages`
(each content a string or a list of blocks; text blocks carry the words), `stream`, and `max_tokens`. A request
without messages is a 400, as upstream. The prompt text for prefix affinity starts with the system prompt, then
each message with its role marker, so two conversations sharing a system prompt share a prefix.
`/v1/messages/count_tokens` is forwarded as it is (upstream: no body parsing, no response processing).
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.requests.openai import (
    ApiKind,
    InferenceRequest,
    UsageDialect,
    _bad,
    _chat_prompt,
    _text_of_content,
    json_object_body,
    model_of,
    request_without_body,
)

MESSAGES_PATH = "messages"
COUNT_TOKENS_PATH = "messages/count_tokens"


def _max_tokens(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def parse_messages(request_id: str, path: str, headers: Mapping[str, str], body: bytes | None) -> InferenceRequest:
    """One Messages API request; raises EppError(BAD_REQUEST) with the reason when it cannot be routed."""
    base = request_without_body(request_id, path, headers)
    if path.split("?", 1)[0].rstrip("/").endswith(COUNT_TOKENS_PATH):
        return base._replace(body_size=len(body or b""), usage=UsageDialect.NONE)
    if not body:
        raise _bad("messages requests need a JSON body")
    parsed = json_object_body(headers, body)
    messages = parsed.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages requests need a non-empty 'messages' list")
    system = parsed.get("system")
    prompt = _chat_prompt(messages)
    if system is not None:
        prompt = f"<system>{_text_of_content(system)}{prompt}"
    return base._replace(
        api=ApiKind.MESSAGES,
        model=model_of(parsed, required=True),
        prompt=prompt,
        stream=parsed.get("stream") is True,
        body=parsed,
        body_size=len(body),
        max_output_tokens=_max_tokens(parsed.get("max_tokens")),
        usage=UsageDialect.ANTHROPIC,
    )
