"""Stateful fuzzing of the ext_proc stream: any order of messages, in any body mode, with hostile bodies.

Hypothesis drives one StreamProcessor per example through sequences Envoy can send (headers, body split anywhere,
trailers, the response) and sequences it cannot (bodies before headers, repeated phases, responses overtaking the
request, messages of no kind), in every request body mode, with bodies from a hostile set. After every message:

- nothing escapes `handle`;
- no answer is unrequested, doubled or out of phase order; nothing follows an ImmediateResponse;
- every message that expects an answer has exactly one once the stream has moved past the point where the answer
  may be held (FULL_DUPLEX and early-body STREAMED hold the request's answers until the decision);
- the stream decides at most once, and the phase reached is one its transition allows.

At the end the stream is closed: every booking is released (in-flight back to zero) and the buffered-body budget is
whole again. `make test` runs 2,000 sequences; `make fuzz` (profile `epp-fuzz`) runs 100,000.
"""

from __future__ import annotations

import json
from collections import Counter

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from prometheus_client import CollectorRegistry

from epp.extproc.bounds import BodyBudget
from epp.extproc.messages import DecisionAnswers
from epp.extproc.stream import TRANSITIONS, Phase, StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import (
    BODY,
    CountingDecider,
    DecidingStream,
    Mode,
    body_msg,
    headers_msg,
    inflight,
    request_trailers,
    response_body,
    response_headers,
    response_trailers,
)

EXAMPLES = max(2_000, settings.default.max_examples)  # the `epp-fuzz` profile (tests/conftest.py) raises it

_DEEP = b'{"model": "m1", "messages": [{"role": "user", "content": ' + b"[" * 3000 + b"]" * 3000 + b"}]}"
HOSTILE_BODIES: list[bytes] = [
    BODY,
    b"",
    b"{",
    b"[]",
    b"null",
    b'{"model": 7, "messages": []}',
    b'{"model": "m1", "messages": [1, 2]}',
    b'{"model": "m1", "messages": "hi"}',
    b'{"model": "m1", "prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}",
    _DEEP,
    b'{"model": "' + b"m" * 70_000 + b'", "prompt": "x"}',
    b'{"model": "m1", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    b"\x1f\x8b\x08\x00garbage",
    json.dumps({"model": "m1", "prompt": "x" * 130_000}).encode(),
]
RESPONSE_BODIES: list[bytes] = [
    b'{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}}',
    b'{"usage": {"prompt_tokens": -5, "completion_tokens": "x"}}',
    b'{"usage": {"prompt_tokens": 1e400}}',
    b'{"usage": [1, 2]}',
    b'data: {"choices":[]}\n\n',
    b'data: {"usage":{"prompt_tokens":',
    b'3,"completion_tokens":{"a":1}}}\n\ndata: [DONE]\n\n',
    b'{"model":"m1","choices":[]}',
    b"\x00" * 70_000,
]
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/"]
REQUEST_MODES = [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED, Mode.BUFFERED_PARTIAL, Mode.STREAMED, Mode.NONE]
RESPONSE_MODES = [Mode.NONE, Mode.STREAMED, Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED]
# Answers in the order the phases come; an answer may never precede one of an earlier phase's kind.
_ORDER = {
    "request_headers": 0,
    "request_body": 1,
    "request_trailers": 2,
    "response_headers": 3,
    "response_body": 4,
    "response_trailers": 5,
}


class StreamMachine(RuleBasedStateMachine):
    @initialize(
        request_mode=st.sampled_from(REQUEST_MODES),
        response_mode=st.sampled_from(RESPONSE_MODES),
        early_body=st.booleans(),
        max_body=st.sampled_from([1 << 20, 200]),
        budget=st.sampled_from([1 << 30, 300]),
    )
    def open_stream(self, request_mode: int, response_mode: int, early_body: bool, max_body: int, budget: int) -> None:
        self.request_mode, self.response_mode, self.early_body = request_mode, response_mode, early_body
        self.decider = CountingDecider()
        self.budget = BodyBudget(budget)
        self.stream = DecidingStream(
            self.decider,
            PickerMetrics(CollectorRegistry()),
            lambda: 0.0,
            StreamSettings(max_body_bytes=max_body),
            DecisionAnswers(),
            self.budget,
        )
        self.received: Counter[str] = Counter()  # messages handled before the stream finished, by kind
        self.answered: Counter[str] = Counter()
        self.last_order = -1
        self.immediate = 0
        self.sent_any = False

    # -- messages ---------------------------------------------------------------------------------------------

    def _send(self, msg: pb.ProcessingRequest) -> None:
        if not self.sent_any:
            self.sent_any = True
            msg.protocol_config.request_body_mode = self.request_mode  # type: ignore[assignment]
            msg.protocol_config.response_body_mode = self.response_mode  # type: ignore[assignment]
            msg.protocol_config.send_body_without_waiting_for_header_response = self.early_body
        before = self.stream.phase
        kind = msg.WhichOneof("request")
        answers = self.stream.handle(msg)  # must not raise
        if before is Phase.FINISHED:
            assert answers == [], "a finished stream answered"
            return
        if kind is not None:
            self.received[kind] += 1
        transition = TRANSITIONS[before].get(kind) if kind is not None else None
        after = self.stream.phase
        if after is not Phase.FINISHED:
            assert transition is not None, f"{kind} in {before.name} was neither refused nor in the table"
            assert after in transition.leads_to, f"{kind}: {before.name} → {after.name} is not in the table"
        for answer in answers:
            assert self.immediate == 0, "an answer followed an ImmediateResponse"
            what = answer.WhichOneof("response")
            if what == "immediate_response":
                self.immediate += 1
                continue
            assert what is not None
            self.answered[what] += 1
            order = _ORDER[what]
            assert order >= self.last_order, f"{what} answered after a later phase"
            self.last_order = order
        if self.immediate:
            assert after is Phase.FINISHED

    @rule(eos=st.booleans(), path=st.sampled_from(PATHS), gzip=st.booleans())
    def request_headers(self, eos: bool, path: str, gzip: bool) -> None:
        extra = {"content-encoding": "gzip"} if gzip else None
        msg = headers_msg(end_of_stream=eos, mode=None, path=path, extra=extra)
        self._send(msg)

    # Bodies are drawn by index: hypothesis handles an index far faster than a value of up to 130 KB.
    @rule(which=st.integers(0, len(HOSTILE_BODIES) - 1), cut=st.integers(0, 1 << 20), eos=st.booleans())
    def request_body(self, which: int, cut: int, eos: bool) -> None:
        body = HOSTILE_BODIES[which]
        cut %= len(body) + 1
        self._send(body_msg(body[:cut], False))
        self._send(body_msg(body[cut:], eos))

    @rule(which=st.integers(0, len(HOSTILE_BODIES) - 1), eos=st.booleans())
    def request_body_whole(self, which: int, eos: bool) -> None:
        self._send(body_msg(HOSTILE_BODIES[which], eos))

    @rule()
    def request_trailers(self) -> None:
        self._send(request_trailers())

    @rule(content_type=st.sampled_from(["application/json", "text/event-stream"]), eos=st.booleans())
    def response_headers(self, content_type: str, eos: bool) -> None:
        self._send(response_headers(content_type, eos))

    @rule(which=st.integers(0, len(RESPONSE_BODIES) - 1), eos=st.booleans())
    def response_body(self, which: int, eos: bool) -> None:
        self._send(response_body(RESPONSE_BODIES[which], eos))

    @rule()
    def response_trailers(self) -> None:
        self._send(response_trailers())

    @rule()
    def message_of_no_kind(self) -> None:
        self._send(pb.ProcessingRequest())

    # -- invariants -------------------------------------------------------------------------------------------

    @invariant()
    def never_unrequested_or_doubled(self) -> None:
        for kind in ("request_headers", "request_trailers", "response_headers", "response_trailers"):
            assert self.answered[kind] <= self.received[kind], f"{kind} answered more often than sent"
        if self.request_mode != Mode.FULL_DUPLEX_STREAMED:  # duplex re-chunks the body it sends back
            assert self.answered["request_body"] <= self.received["request_body"]
        if self.response_mode != Mode.FULL_DUPLEX_STREAMED:
            assert self.answered["response_body"] <= self.received["response_body"]

    @invariant()
    def every_answer_owed_is_given(self) -> None:
        phase = self.stream.phase
        if phase is Phase.FINISHED:
            return  # the ImmediateResponse answers everything still owed; Envoy ends the request on it
        holds = self.request_mode == Mode.FULL_DUPLEX_STREAMED or (
            self.request_mode == Mode.STREAMED and self.early_body
        )
        if holds and phase < Phase.RESPONSE_HEADERS:
            return  # the request's answers wait for the decision
        owed = ["request_headers", "request_trailers", "response_headers", "response_trailers"]
        if self.request_mode != Mode.FULL_DUPLEX_STREAMED:
            owed.append("request_body")
        if self.response_mode != Mode.FULL_DUPLEX_STREAMED:
            owed.append("response_body")
        for kind in owed:
            assert self.answered[kind] == self.received[kind], (
                f"{kind}: {self.received[kind]} sent, answered {dict(self.answered)}"
            )

    @invariant()
    def decides_at_most_once(self) -> None:
        assert self.decider.decided <= 1
        assert 0 <= inflight(self.decider.inner) <= 1

    def teardown(self) -> None:
        self.stream.close()
        self.stream.close()
        assert self.decider.completed == self.decider.decided
        assert inflight(self.decider.inner) == 0
        assert self.budget.used == 0


StreamMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=12, deadline=None)
test_stream_sequences = StreamMachine.TestCase
