"""The OpenAI request bodies as the simulated server reads them: the prompt text of a completion, chat or
embedding request, its size in tokens and cached blocks, and the error bodies vLLM answers with."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from epp.sim.tokens import CHARS_PER_TOKEN


def prompt_units(text: str, block_size: int) -> tuple[int, tuple[int, ...]]:
    """(prompt tokens, chain hashes of the full blocks) for a prompt text, at CHARS_PER_TOKEN characters a token."""
    tokens = max(1, -(-len(text) // CHARS_PER_TOKEN))
    step = block_size * CHARS_PER_TOKEN
    hashes: list[int] = []
    h = 0
    for start in range(0, len(text) - step + 1, step):
        h = hash((h, text[start : start + step]))
        hashes.append(h)
    return tokens, tuple(hashes)


class BadRequest(Exception):
    """A request the simulated server refuses, as vLLM would: the message and the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def error_response(message: str, status: int = 400) -> web.Response:
    kind = "NotFoundError" if status == 404 else "BadRequestError"
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def text_of(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(text_of(v) for v in value)
    if isinstance(value, dict):
        return text_of(value.get("text", ""))
    return ""


def prompt_text(kind: str, body: dict[str, Any]) -> str:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        return "".join(f"<{m.get('role', '')}>{text_of(m.get('content'))}" for m in messages if isinstance(m, dict))
    key = "prompt" if kind == "completion" else "input"
    value = body.get(key)
    if value in (None, "", []):
        raise BadRequest(f"'{key}' is required")
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return " " * (CHARS_PER_TOKEN * len(value))  # token ids: only their count matters here
    return text_of(value)
