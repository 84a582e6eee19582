"""The vllm backend of token-producer over real HTTP: the simulator's render endpoints, the fallback to the estimate
on failure, the per-prompt cache (upstream's `dataproducer/tokenizer/README.md`, `vllm_http.go`)."""

import asyncio
import json
import socket
from typing import Any

import numpy as np

from epp.config.decode import parse_config
from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Decision, Director
from epp.director.decision import Decided
from epp.director.tokens import RenderTokenizer
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler
from epp.scheduling.framework import CycleState, produced
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.server import SimServer
from epp.sim.tokens import token_ids

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def _completion(prompt: str) -> InferenceRequest:
    body = {"model": DEFAULT_MODEL, "prompt": prompt}
    return InferenceRequest("r", ApiKind.COMPLETIONS, DEFAULT_MODEL, prompt, body=body)


def _chat(text: str) -> InferenceRequest:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": text}]}
    return InferenceRequest("r", ApiKind.CHAT, DEFAULT_MODEL, text, body=body)


async def _sim() -> SimServer:
    server = SimServer(ServerConfig(name="render", port=0))
    await server.start()
    return server


async def test_completions_and_chat_get_the_engines_token_ids_and_are_cached() -> None:
    """tokenizer/README.md: POST /v1/completions/render and /v1/chat/completions/render, read token_ids."""
    server = await _sim()
    try:
        tokenizer = RenderTokenizer(f"http://127.0.0.1:{server.port}", DEFAULT_MODEL)
        got = await tokenizer.tokenize(_completion("hello render world"))
        assert got.token_ids == tuple(token_ids("hello render world"))
        chat = await tokenizer.tokenize(_chat("hi"))
        assert chat.token_ids == tuple(token_ids("<user>hi"))
        again = await tokenizer.tokenize(_completion("hello render world"))
        assert again.token_ids == got.token_ids
        assert (server.render_calls, tokenizer.calls, tokenizer.failures) == (2, 2, 0)  # the third came from cache
    finally:
        await server.stop()


async def test_the_cache_is_bounded() -> None:
    server = await _sim()
    try:
        tokenizer = RenderTokenizer(f"http://127.0.0.1:{server.port}", DEFAULT_MODEL, cache_size=2)
        for prompt in ("a", "b", "c", "a"):
            await tokenizer.tokenize(_completion(prompt))
        assert server.render_calls == 4  # "a" was evicted by "c"
    finally:
        await server.stop()


async def test_a_refused_connection_or_a_bad_answer_falls_back_to_the_estimate() -> None:
    """tokenizer/README.md failure mode: per-request errors go back to the director, which continues."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    tokenizer = RenderTokenizer(f"http://127.0.0.1:{port}", DEFAULT_MODEL)
    request = _completion("x")
    assert await tokenizer.tokenize(request) is request
    server = await _sim()
    try:  # the simulator refuses an unknown model with 404: no ids, the request unchanged
        bad = InferenceRequest("r", ApiKind.COMPLETIONS, "nope", "x", body={"model": "nope", "prompt": "x"})
        tokenizer = RenderTokenizer(f"http://127.0.0.1:{server.port}", DEFAULT_MODEL)
        assert (await tokenizer.tokenize(bad)).token_ids is None
        assert tokenizer.failures == 1
    finally:
        await server.stop()


async def test_a_render_endpoint_that_never_answers_times_out_to_the_estimate() -> None:
    """tokenizer/README.md: vllm.timeout (5 s default) bounds the call; here 0.2 s."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        tokenizer = RenderTokenizer(f"http://127.0.0.1:{port}", DEFAULT_MODEL, timeout_s=0.2)
        request = _completion("x")
        assert await tokenizer.tokenize(request) is request
        assert tokenizer.failures == 1
    finally:
        listener.close()


def _rendering_director(port: int) -> tuple[Any, EndpointTable, Director]:
    """A director whose config has a vllm token-producer rendering at the simulator on `port`, one endpoint."""
    doc = {
        **BASE,
        "plugins": [
            {
                "type": "token-producer",
                "parameters": {"modelName": DEFAULT_MODEL, "vllm": {"url": f"http://127.0.0.1:{port}"}},
            },
            {"type": "queue-scorer"},
        ],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    scheduler = build_scheduler(parse_config(doc, "cfg.yaml"))
    table = EndpointTable()
    table.replace_all([EndpointInfo(address="127.10.0.1:8000")])
    table.synced = True
    return scheduler, table, Director(table, scheduler, clock=lambda: 0.0)


async def test_the_director_passes_the_engine_tokens_to_the_scheduler() -> None:
    """The render call runs in the lifecycle before the pure scheduler; the token producer publishes the ids."""
    server = await _sim()
    try:
        scheduler, table, director = _rendering_director(server.port)
        tokenizer = director.pipeline.tokenizer
        assert tokenizer is not None
        assert director.pipeline.immediate is None  # a stage waits: the render call
        steps = [s async for s in director.pipeline.run(_completion("one two three four"), None)]
        assert len(steps) == 1 and isinstance(steps[0], Decided)  # no hold: no flow control
        decision = steps[0].outcome
        assert isinstance(decision, Decision)
        assert decision.tokens == len(token_ids("one two three four"))
        # and what the producer publishes for such a request: the exact ids
        snap = table.snapshot()
        request = await tokenizer.tokenize(_completion("one two three four"))
        state = CycleState(snap, snap.slots, request, 0.0)
        for producer in scheduler.handler.profile.producers:
            producer.produce(state)
        tokens = produced(state, "token-producer")
        assert tokens.exact
        assert np.frombuffer(tokens.data, "<u4").tolist() == token_ids("one two three four")
    finally:
        await server.stop()


async def test_through_the_ext_proc_server_the_decision_uses_the_engines_tokens() -> None:
    """The render call runs in the director's pipeline, which the grpc.aio adapter runs when the stream asks for
    its decision (the stream itself is pure)."""
    from prometheus_client import CollectorRegistry

    from epp.extproc.server import ExternalProcessor
    from epp.extproc.stream import StreamSettings
    from epp.observability.metrics import PickerMetrics
    from tests.extproc.envoy import body_msg, headers_msg

    server = await _sim()
    try:
        _, _, director = _rendering_director(server.port)
        decisions = []

        class Recording:
            def __init__(self):
                self.pipeline = director.pipeline.around(self.decide, director.complete)

            def decide(self, request, subset=None):
                decisions.append(director.decide(request, subset))
                return decisions[-1]

        processor = ExternalProcessor(Recording(), PickerMetrics(CollectorRegistry()), StreamSettings())
        text = "render me through the stream"
        body = json.dumps({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": text}]}).encode()

        async def messages():
            yield headers_msg()
            yield body_msg(body, True)

        answers = [a async for a in processor.Process(messages(), None)]
        assert answers
        assert server.render_calls == 1
        assert [d.tokens for d in decisions] == [len(token_ids("<user>" + text))]  # not the estimate (9 vs 7)
    finally:
        await server.stop()
