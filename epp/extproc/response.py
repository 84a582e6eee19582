"""What the picker reads and restores in a model server's response: token usage, and the model name it rewrote.

Pure: bytes in, bytes and a usage value out, no I/O and no metrics. The ext_proc state machine feeds it each
response body chunk and reports what it returns.

Usage comes from a JSON body or from the SSE event that carries `usage` (usually the last one). Chunks may split
an event or a JSON document anywhere, so the unfinished part is carried over to the next chunk: for SSE only the
incomplete last event, for JSON the body so far (up to `MAX_USAGE_BUFFER`).

The counts come from another program and are not trusted: a count must be a JSON integer between 0 and
`MAX_TOKENS`; anything else (negative, fractional, a string, a huge number, an object) makes the whole `usage`
value invalid. An invalid usage is reported as such, once, and never touches the response itself.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import orjson

MAX_USAGE_BUFFER = 1 << 20  # response bytes kept to find `usage`; a larger JSON answer is not searched
MAX_TOKENS = 1 << 31  # no model context comes near it; a larger count is a broken server, not a real request


class Usage(NamedTuple):
    """Token counts of one response; `valid` False when the server sent counts that cannot be true."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = -1  # usage.prompt_tokens_details.cached_tokens; -1: not reported
    valid: bool = True


INVALID_USAGE = Usage(0, 0, valid=False)


def usage_of(value: object) -> Usage:
    """The `usage` member of a response, checked: missing counts are 0, wrong ones make it invalid."""
    if not isinstance(value, dict):
        return INVALID_USAGE
    prompt = value.get("prompt_tokens", 0)
    completion = value.get("completion_tokens", 0)
    # `type(...) is int` refuses bool (a subclass of int) as well as floats and strings.
    if type(prompt) is not int or type(completion) is not int:
        return INVALID_USAGE
    if not (0 <= prompt <= MAX_TOKENS and 0 <= completion <= MAX_TOKENS):
        return INVALID_USAGE
    details = value.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if type(cached) is not int or not 0 <= cached <= prompt:  # an implausible cached count is just not recorded
        cached = -1
    return Usage(prompt, completion, cached)


def model_restorer(target: str, original: str) -> tuple[bytes, bytes]:
    """The byte pair `ResponseTracker` swaps back: the model name the endpoint served, and the one the client sent.

    Written as Python's json writes them (non-ASCII as \\u escapes), which is how Python model servers echo them.
    """
    return json.dumps(target).encode(), json.dumps(original).encode()


class ResponseTracker:
    """One response's body, chunk by chunk: finds `usage` once and puts a rewritten model name back."""

    __slots__ = ("_done", "_rewrite", "_sse", "_tail")

    def __init__(self, sse: bool, rewrite: tuple[bytes, bytes] | None) -> None:
        self._sse = sse
        self._rewrite = rewrite
        self._tail = b""
        self._done = False  # usage found (valid or not): nothing more is searched

    @property
    def rewrites(self) -> bool:
        return self._rewrite is not None

    def feed(self, body: bytes, end_of_stream: bool) -> tuple[bytes, Usage | None]:
        """The chunk to send on (the model name restored), and the usage if this chunk completed it."""
        usage = None if self._done else self._read_usage(body, end_of_stream)
        if usage is not None:
            self._done = True
            self._tail = b""
        if self._rewrite is not None:
            body = self._restore_model(body)
        return body, usage

    def _restore_model(self, body: bytes) -> bytes:
        assert self._rewrite is not None
        target, original = self._rewrite
        return body.replace(b'"model":' + target, b'"model":' + original).replace(
            b'"model": ' + target, b'"model": ' + original
        )

    def _read_usage(self, body: bytes, end_of_stream: bool) -> Usage | None:
        text = self._tail + body if self._tail else body
        if self._sse:
            if end_of_stream:
                complete, self._tail = text, b""
            else:
                head, sep, rest = text.rpartition(b"\n\n")
                complete, rest = (head, rest) if sep else (b"", text)
                self._tail = rest[-MAX_USAGE_BUFFER:]
            if b'"usage"' not in complete:
                return None
            candidates = [
                line[5:].strip() for line in complete.split(b"\n") if line.startswith(b"data:") and b'"usage"' in line
            ]
        else:
            if not end_of_stream:
                self._tail = text if len(text) <= MAX_USAGE_BUFFER else b""
                return None
            self._tail = b""
            if b'"usage"' not in text:
                return None
            candidates = [text]
        unreadable = False
        for raw in reversed(candidates):
            try:
                document = orjson.loads(raw)
            except ValueError:  # not JSON, or a number JSON cannot hold (1e400)
                unreadable = True
                continue
            if isinstance(document, dict) and "usage" in document:
                value = document["usage"]
                if value is None:  # OpenAI sends `"usage": null` on chunks before the last
                    continue
                return usage_of(value)
        return INVALID_USAGE if unreadable else None
