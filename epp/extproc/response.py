"""What the picker reads and restores in a model server's response: token usage, and the model name it rewrote.

Pure: bytes in, bytes and a usage value out, no I/O and no metrics. The ext_proc state machine feeds it each
response body chunk and reports what it returns.

Usage comes from a JSON body or from the SSE event that carries `usage` (usually the last one). Chunks may split
an event or a JSON document anywhere, so the unfinished part is carried over to the next chunk: for SSE only the
incomplete last line, for JSON the body so far (up to `MAX_USAGE_BUFFER`). SSE `data:` lines are read one by one,
with or without the blank line between events: a chunk that starts with `data:` ends the line before it.

The counts come from another program and are not trusted: a count must be a JSON integer between 0 and
`MAX_TOKENS`; anything else (negative, fractional, a string, a huge number, an object) makes the whole `usage`
value invalid. An invalid usage is reported as such, once, and never touches the response itself.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import orjson

from epp.requests import UsageDialect

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


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_TOKENS else None


def anthropic_usage_of(value: object, prompt: int = 0, cached: int = -1) -> Usage:
    """An Anthropic `usage` object (`input_tokens`, `output_tokens`, `cache_read_input_tokens`), checked as
    `usage_of` checks OpenAI's; `prompt` and `cached` fill in what an SSE `message_delta` leaves out."""
    if not isinstance(value, dict):
        return INVALID_USAGE
    prompt_count, output = _count(value.get("input_tokens", prompt)), _count(value.get("output_tokens", 0))
    if prompt_count is None or output is None:
        return INVALID_USAGE
    cache = _count(value.get("cache_read_input_tokens", cached))
    return Usage(prompt_count, output, -1 if cache is None else cache)  # an implausible cached count: not recorded


def model_restorer(target: str, original: str) -> tuple[bytes, bytes]:
    """The byte pair `ResponseTracker` swaps back: the model name the endpoint served, and the one the client sent.

    Written as Python's json writes them (non-ASCII as \\u escapes), which is how Python model servers echo them.
    """
    return json.dumps(target).encode(), json.dumps(original).encode()


class ResponseTracker:
    """One response's body, chunk by chunk: finds `usage` once and puts a rewritten model name back."""

    __slots__ = ("_dialect", "_done", "_rewrite", "_sse", "_started", "_tail")

    def __init__(
        self, sse: bool, rewrite: tuple[bytes, bytes] | None, dialect: UsageDialect = UsageDialect.OPENAI
    ) -> None:
        self._sse = sse
        self._rewrite = rewrite
        self._dialect = dialect
        self._tail = b""
        # usage found (valid or not), or never read (passthrough): nothing more is searched
        self._done = dialect is UsageDialect.NONE
        self._started: Usage | None = None  # Anthropic SSE: the prompt counts `message_start` gave

    @property
    def rewrites(self) -> bool:
        return self._rewrite is not None

    def feed(self, body: bytes, end_of_stream: bool) -> tuple[bytes, Usage | None]:
        """The chunk to send on (the model name restored), and the usage if this chunk completed it."""
        usage = None if self._done else self._read_usage(body, end_of_stream)
        if usage is None and end_of_stream and not self._done and self._started is not None:
            usage = self._started  # an Anthropic stream that ended after message_start alone
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
        tail = self._tail
        if self._sse:
            # Each `data:` line is read on its own (as upstream reads it), so a line is complete at its newline; a
            # chunk that starts with `data:` also completes the line before it (servers that send one event per
            # chunk without the blank line between them).
            text = (tail + b"\n" + body if body.startswith(b"data:") else tail + body) if tail else body
            if end_of_stream:
                complete, self._tail = text, b""
            else:
                head, sep, rest = text.rpartition(b"\n")
                complete, rest = (head, rest) if sep else (b"", text)
                self._tail = rest[-MAX_USAGE_BUFFER:]
            if b'"usage"' not in complete:
                return None
            candidates = [
                line[5:].strip() for line in complete.split(b"\n") if line.startswith(b"data:") and b'"usage"' in line
            ]
        else:
            text = tail + body if tail else body
            if not end_of_stream:
                self._tail = text if len(text) <= MAX_USAGE_BUFFER else b""
                return None
            self._tail = b""
            if b'"usage"' not in text:
                return None
            candidates = [text]
        if self._dialect is UsageDialect.ANTHROPIC:
            return self._anthropic(candidates)
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

    def _anthropic(self, candidates: list[bytes]) -> Usage | None:
        """Anthropic: the JSON body's `usage`, or, streamed, `message_start` (the prompt) then `message_delta` (the
        output count, cumulative; it ends the search). A stream that ends after `message_start` alone reports it."""
        for raw in candidates:
            try:
                document = orjson.loads(raw)
            except ValueError:
                return INVALID_USAGE
            if not isinstance(document, dict):
                continue
            if not self._sse:
                return anthropic_usage_of(document["usage"]) if "usage" in document else None
            kind = document.get("type")
            if kind == "message_start":
                message = document.get("message")
                started = anthropic_usage_of(message.get("usage") if isinstance(message, dict) else None)
                if not started.valid:
                    return started
                self._started = started
            elif kind == "message_delta" and "usage" in document:
                prompt = self._started.prompt_tokens if self._started is not None else 0
                cached = self._started.cached_tokens if self._started is not None else 0
                return anthropic_usage_of(document["usage"], prompt, cached)
        return None
