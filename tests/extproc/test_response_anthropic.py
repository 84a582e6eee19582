"""Usage from Anthropic responses, JSON and streamed.

Facts from llm-d-router @ebab687927f5 `pkg/epp/framework/plugins/requesthandling/parsers/anthropic/anthropic.go`:
a JSON response carries `usage.input_tokens`, `output_tokens` and `cache_read_input_tokens`; a `text/event-stream`
response carries the prompt counts in `message_start` (`message.usage`) and the output count in `message_delta`
(`usage.output_tokens`).
"""

import pytest

from epp.extproc.response import ResponseTracker, Usage
from epp.requests import UsageDialect

ANTHROPIC = UsageDialect.ANTHROPIC

SSE = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","model":"claude-x",'
    b'"usage":{"input_tokens":25,"cache_read_input_tokens":8,"output_tokens":1}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hello"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":15}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def test_json_usage() -> None:
    tracker = ResponseTracker(False, None, ANTHROPIC)
    body = b'{"id":"m","usage":{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":5}}'
    assert tracker.feed(body[:10], False)[1] is None
    assert tracker.feed(body[10:], True)[1] == Usage(12, 3, cached_tokens=5)


@pytest.mark.parametrize("cut", [1, 40, 150, 230, len(SSE) - 5])
def test_streamed_usage_across_any_chunking(cut) -> None:
    tracker = ResponseTracker(True, None, ANTHROPIC)
    found = [u for chunk, end in ((SSE[:cut], False), (SSE[cut:], True)) if (u := tracker.feed(chunk, end)[1])]
    assert found == [Usage(25, 15, cached_tokens=8)]


def test_a_stream_cut_after_message_start_reports_the_prompt() -> None:
    tracker = ResponseTracker(True, None, ANTHROPIC)
    start = SSE[: SSE.index(b"event: content_block_delta")]
    assert tracker.feed(start, False)[1] is None
    assert tracker.feed(b"", True)[1] == Usage(25, 1, cached_tokens=8)


def test_odd_counts_are_invalid_not_a_crash() -> None:
    tracker = ResponseTracker(False, None, ANTHROPIC)
    assert tracker.feed(b'{"usage":{"input_tokens":-1,"output_tokens":2}}', True)[1].valid is False


def test_openai_fields_are_not_read_as_anthropic_and_passthrough_reads_nothing() -> None:
    assert ResponseTracker(False, None, UsageDialect.NONE).feed(b'{"usage":{"prompt_tokens":1}}', True)[1] is None
    openai = ResponseTracker(False, None, UsageDialect.OPENAI)
    assert openai.feed(b'{"usage":{"prompt_tokens":4,"completion_tokens":2}}', True)[1] == Usage(4, 2)
