"""Upstream's four parsers: which path each claims, what each reads, and what each refuses.

Facts from llm-d-router @ebab687927f5:
- `pkg/epp/handlers/parsers.go`: longest claimed suffix wins whatever the order; a parser claiming no path is the
  fallback and ends the list; a duplicate type is skipped.
- `pkg/epp/framework/plugins/requesthandling/parsers/README.md` and `pkg/epp/config/loader/defaults.go`
  (`ensureParsers`): the default list is openai, anthropic, vllmhttp, passthrough; an explicit list gains no
  fallback, so a path none of its parsers claims is rejected.
- `parsers/openai/openai.go` `Claims`: chat/completions, completions, embeddings, responses, conversations, the two
  `/render` paths, images/generations.
- `parsers/anthropic/anthropic.go`: claims `messages` and `messages/count_tokens`; reads `model`, `messages` (at least
  one, else an error), `system`, `stream`, `max_tokens`; count_tokens is forwarded unparsed.
- `parsers/vllmhttp/vllmhttp.go`: claims `inference/v1/generate`; `token_ids` must be non-empty; `model` and
  `stream` optional; `max_tokens` under `sampling_params`.
- `parsers/passthrough/README.md`: no body parsing; payload-based scorers get nothing.
"""

import pytest

from epp.errors import EppError
from epp.requests import DEFAULT_PARSERS, PARSER_TYPES, ApiKind, ParserChain, UsageDialect
from epp.scheduling.plugin_type import Kind
from epp.scheduling.registry import builtin_registry

MESSAGES_BODY = (
    b'{"model":"claude-x","max_tokens":64,"stream":true,"system":[{"type":"text","text":"Be brief."}],'
    b'"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}]}'
)


@pytest.mark.parametrize(
    ("path", "parser"),
    [
        ("/v1/chat/completions", "openai-parser"),
        ("/v1/completions", "openai-parser"),
        ("/v1/chat/completions/render", "openai-parser"),
        ("/v1/embeddings", "openai-parser"),
        ("/v1/responses", "openai-parser"),
        ("/v1/conversations", "openai-parser"),
        ("/v1/images/generations", "openai-parser"),
        ("/v1/messages", "anthropic-parser"),
        ("/v1/messages/count_tokens", "anthropic-parser"),
        ("/inference/v1/generate", "vllmhttp-parser"),
        ("/v1/chat/completions?x=1", "openai-parser"),
        ("/v1/models", "passthrough-parser"),
        ("/generate", "passthrough-parser"),
        ("/", "passthrough-parser"),
    ],
)
def test_default_list_chooses_by_path(path, parser) -> None:
    resolved = DEFAULT_PARSERS.resolve(path)
    assert resolved is not None and resolved.type_name == parser


def test_longest_suffix_wins_whatever_the_order() -> None:
    chain = ParserChain(["openai-parser", "anthropic-parser"])
    assert chain.resolve("/v1/messages/count_tokens").type_name == "anthropic-parser"
    reordered = ParserChain(["vllmhttp-parser", "openai-parser"])
    assert reordered.resolve("/v1/completions/render").type_name == "openai-parser"


def test_an_explicit_list_without_fallback_refuses_other_paths() -> None:
    chain = ParserChain(["openai-parser"])
    with pytest.raises(EppError) as err:
        chain.parse("r", "/v1/messages", {}, MESSAGES_BODY)
    assert err.value.code.http_status == 400 and "no parser claims the path /v1/messages" in err.value.message


def test_the_fallback_ends_the_list_and_duplicates_are_skipped() -> None:
    chain = ParserChain(["openai-parser", "openai-parser", "passthrough-parser", "anthropic-parser"])
    assert chain.type_names == ("openai-parser", "passthrough-parser")
    assert chain.resolve("/v1/messages").type_name == "passthrough-parser"


def test_anthropic_messages_are_read() -> None:
    request = DEFAULT_PARSERS.parse("r", "/v1/messages", {}, MESSAGES_BODY)
    assert request.api is ApiKind.MESSAGES and request.model == "claude-x" and request.stream
    assert request.max_output_tokens == 64 and request.usage is UsageDialect.ANTHROPIC
    assert request.prompt == "<system>Be brief.<user>hi<assistant>yo"
    assert request.body is not None and request.body_size == len(MESSAGES_BODY)


def test_anthropic_system_as_a_string() -> None:
    body = b'{"model":"m","system":"S","messages":[{"role":"user","content":"q"}]}'
    assert DEFAULT_PARSERS.parse("r", "/v1/messages", {}, body).prompt == "<system>S<user>q"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"model":"m","messages":[]}', "non-empty 'messages'"),
        (b'{"model":"m"}', "non-empty 'messages'"),
        (b'{"messages":[{"role":"user","content":"q"}]}', "'model' is missing"),
        (b'{"model":"m","messages":["q"]}', "must be an object"),
        (b"not json", "not valid JSON"),
        (b"", "need a JSON body"),
    ],
)
def test_anthropic_refusals(body, words) -> None:
    with pytest.raises(EppError) as err:
        DEFAULT_PARSERS.parse("r", "/v1/messages", {}, body)
    assert err.value.code.http_status == 400 and words in err.value.message


def test_count_tokens_is_forwarded_unparsed() -> None:
    request = DEFAULT_PARSERS.parse("r", "/v1/messages/count_tokens", {}, b"{not json")
    assert request.model == "" and request.body is None and request.usage is UsageDialect.NONE


def test_vllm_generate_reads_token_ids() -> None:
    body = b'{"token_ids":[1,2,3,55296],"sampling_params":{"max_tokens":9},"stream":true}'
    request = DEFAULT_PARSERS.parse("r", "/inference/v1/generate", {}, body)
    assert request.api is ApiKind.GENERATE and request.model == "" and request.stream
    assert request.max_output_tokens == 9 and len(request.prompt) == 4
    assert request.prompt.encode()  # every id has its own code point, no surrogate
    shared = DEFAULT_PARSERS.parse("r", "/inference/v1/generate", {}, b'{"token_ids":[1,2,3,7],"model":"m"}')
    assert shared.prompt[:3] == request.prompt[:3] and shared.model == "m"


@pytest.mark.parametrize(
    "body", [b'{"token_ids":[]}', b'{"prompt":"x"}', b'{"token_ids":["a"]}', b'{"token_ids":[-1]}']
)
def test_vllm_generate_needs_token_ids(body) -> None:
    with pytest.raises(EppError) as err:
        DEFAULT_PARSERS.parse("r", "/inference/v1/generate", {}, body)
    assert err.value.code.http_status == 400 and "token_ids" in err.value.message


def test_passthrough_reads_nothing_and_accepts_any_body() -> None:
    request = DEFAULT_PARSERS.parse("r", "/upload", {"x-gateway-inference-objective": "batch"}, b"\x00\xffnot json")
    assert request.model == "" and request.prompt == "" and request.body is None
    assert request.body_size == 10 and request.usage is UsageDialect.NONE
    assert request.objective == "batch"  # headers are still read


def test_without_body_keeps_the_parsers_usage_dialect() -> None:
    assert DEFAULT_PARSERS.without_body("r", "/v1/messages", {}).usage is UsageDialect.ANTHROPIC


def test_the_registry_and_the_request_path_know_the_same_parsers() -> None:
    registry = builtin_registry()
    registered = {name for name in registry.names() if registry.get(name).kind is Kind.PARSER}
    assert registered == set(PARSER_TYPES)
