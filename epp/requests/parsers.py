"""Which parser reads a request: upstream's parser plugins, chosen by the path suffixes each one claims.

As upstream's parser registry (llm-d-router `pkg/epp/handlers/parsers.go`, `parsers/README.md`): parsers are taken in
the configured order; each claims path suffixes and the longest matching suffix wins whatever the order; a parser
that claims no path (`passthrough-parser`) takes every other path and ends the list (later ones are skipped with a
warning); a second parser of a type already listed is skipped. Without `requestHandler.parsers` the list is
upstream's default (openai, anthropic, vllmhttp, passthrough), so no path is refused; an explicit list without a
fallback refuses a path none of its parsers claims with a 400. One difference: a suffix matches at a path segment
boundary here (`/v1/xcompletions` is not `completions`), where upstream compares bare string suffixes.

`epp.scheduling.registry` registers the same type names (as markers: the decision layer may not import this one);
a test keeps the two lists equal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from epp.errors import EppError, ErrorCode
from epp.requests.anthropic import COUNT_TOKENS_PATH, MESSAGES_PATH, parse_messages
from epp.requests.openai import InferenceRequest, UsageDialect, parse_request, request_without_body
from epp.requests.vllm import GENERATE_PATH, parse_generate

log = logging.getLogger(__name__)

ParseFn = Callable[[str, str, Mapping[str, str], bytes | None], InferenceRequest]

DEFAULT_PARSER_TYPES = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")


class Parser(NamedTuple):
    type_name: str
    paths: tuple[str, ...]  # claimed suffixes, without slashes at either end; () = the fallback
    parse: ParseFn
    usage: UsageDialect


def _passthrough(request_id: str, path: str, headers: Mapping[str, str], body: bytes | None) -> InferenceRequest:
    """No body parsing: a pool-level pick, the body forwarded untouched whatever it holds (JSON or not)."""
    return request_without_body(request_id, path, headers)._replace(body_size=len(body or b""), usage=UsageDialect.NONE)


OPENAI_PATHS = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "conversations",
    "chat/completions/render",
    "completions/render",
    "images/generations",
)

PARSER_TYPES: Mapping[str, Parser] = {
    "openai-parser": Parser("openai-parser", OPENAI_PATHS, parse_request, UsageDialect.OPENAI),
    "anthropic-parser": Parser(
        "anthropic-parser", (MESSAGES_PATH, COUNT_TOKENS_PATH), parse_messages, UsageDialect.ANTHROPIC
    ),
    "vllmhttp-parser": Parser("vllmhttp-parser", (GENERATE_PATH,), parse_generate, UsageDialect.OPENAI),
    "passthrough-parser": Parser("passthrough-parser", (), _passthrough, UsageDialect.NONE),
}

DEFAULT_PATH = "/v1/completions"  # upstream's path for a request whose headers name none


def request_path(headers: Mapping[str, str]) -> str:
    """The path the parser is chosen by: `:path`, then `x-original-path`, then `x-forwarded-path`, else
    `/v1/completions`, as upstream reads it (its GetRequestPath)."""
    return headers.get(":path") or headers.get("x-original-path") or headers.get("x-forwarded-path") or DEFAULT_PATH


_MEMO_LIMIT = 1024  # distinct paths remembered; query strings make paths unbounded


class ParserChain:
    """The configured parsers; `parse` picks one by path and runs it."""

    def __init__(self, type_names: Sequence[str]) -> None:
        unknown = [t for t in type_names if t not in PARSER_TYPES]
        if unknown:
            raise ValueError(f"unknown parser type(s): {', '.join(unknown)}")
        entries: list[Parser] = []
        fallback: Parser | None = None
        for i, name in enumerate(type_names):
            parser = PARSER_TYPES[name]
            if any(p.type_name == name for p in entries):
                log.warning("parser %s is listed twice; the second is skipped", name)
                continue
            if not parser.paths:
                fallback = parser
                for skipped in type_names[i + 1 :]:
                    log.warning("parser %s comes after the fallback parser %s and is skipped", skipped, name)
                break
            entries.append(parser)
        self.parsers = tuple(entries) + ((fallback,) if fallback is not None else ())
        self._claims = sorted(((s, p) for p in entries for s in p.paths), key=lambda c: -len(c[0]))
        self._fallback = fallback
        self._by_path: dict[str, Parser | None] = {}

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(p.type_name for p in self.parsers)

    def resolve(self, path: str) -> Parser | None:
        """The parser for a `:path` (query ignored): the longest claimed suffix, else the fallback, else None."""
        if path in self._by_path:
            return self._by_path[path]
        stripped = path.split("?", 1)[0].strip().rstrip("/")
        found = self._fallback
        for suffix, parser in self._claims:
            if stripped == suffix or stripped.endswith("/" + suffix):
                found = parser
                break
        if len(self._by_path) >= _MEMO_LIMIT:
            self._by_path.clear()
        self._by_path[path] = found
        return found

    def _parser(self, path: str) -> Parser:
        parser = self.resolve(path)
        if parser is None:
            raise EppError(
                ErrorCode.BAD_REQUEST,
                f"no parser claims the path {path.split('?', 1)[0]} (parsers: {', '.join(self.type_names)})",
            )
        return parser

    def parse(self, request_id: str, path: str, headers: Mapping[str, str], body: bytes | None) -> InferenceRequest:
        """Parse one request with the parser its path selects; EppError(BAD_REQUEST) says why it cannot be."""
        parser = self._by_path.get(path)  # the usual case, a path seen before: one dict lookup on the hot path
        if parser is None:
            parser = self._parser(path)
        return parser.parse(request_id, path, headers, body)

    def without_body(
        self, request_id: str, path: str, headers: Mapping[str, str], no_body: bool = False
    ) -> InferenceRequest:
        """A request decided on its headers alone, its usage read as its parser would: one whose body the picker
        does not see (body modes NONE/STREAMED: a path no parser claims is refused, as its body would be), or,
        `no_body`, one that has none (request headers with end_of_stream): never refused, as upstream routes it
        to an endpoint of the pool without asking a parser."""
        if no_body:
            parser = self.resolve(path)
            usage = parser.usage if parser is not None else UsageDialect.NONE
            return request_without_body(request_id, path, headers, no_body=True)._replace(usage=usage)
        usage = self._parser(path).usage
        return request_without_body(request_id, path, headers)._replace(usage=usage)


DEFAULT_PARSERS = ParserChain(DEFAULT_PARSER_TYPES)
