"""Request bodies parsed into the small value the decision needs: OpenAI, Anthropic Messages, vLLM generate, or
passed through unread, by the parser the request's path selects (`parsers`)."""

from epp.kvevents.token_ids import TokenIds
from epp.requests.openai import (
    ApiKind,
    InferenceRequest,
    UsageDialect,
    api_kind_of_path,
    parse_request,
    request_without_body,
)
from epp.requests.parsers import DEFAULT_PARSERS, PARSER_TYPES, ParserChain, request_path

__all__ = [
    "DEFAULT_PARSERS",
    "PARSER_TYPES",
    "ApiKind",
    "InferenceRequest",
    "ParserChain",
    "TokenIds",
    "UsageDialect",
    "api_kind_of_path",
    "parse_request",
    "request_path",
    "request_without_body",
]
