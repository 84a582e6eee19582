"""The precise pipeline on the real serving path: `epp serve` with upstream's precise sample, an ordinary OpenAI
completions and chat request over ext_proc, the vllm token-producer's render call to a simulator, and the precise
producer matching those token ids against the engines' KV events (not the approximate fallback).

Each prompt is cached on one simulator by a request sent to it directly, so the picker never routed it: only the
engines' events can tell where it lives, and only the render call's token ids can be matched against them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.server import SimServer
from tests.extproc.envoy import body_msg, destination, headers_msg
from tests.support.precise import precise_sample, until_every_publisher_heard
from tests.support.procs import free_port, http_ok, http_text, metric_value, running, serve_argv
from tests.support.tls import SELF_SIGNED_NAME, presented_certificate

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

INDEXED = "llm_d_epp_kv_cache_events_indexed_blocks"


def _prompt(seed: int, chars: int = 4000) -> str:
    return " ".join(f"p{seed}-{i:05d}" for i in range(chars // 8 + 1))[:chars]


def _completion(seed: int) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "prompt": _prompt(seed), "max_tokens": 2}


def _chat(seed: int) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": _prompt(seed)}], "max_tokens": 2}


def _config(tmp: Path, render_url: str, kv_port: int) -> Path:
    path = tmp / "precise.yaml"
    path.write_text(yaml.safe_dump(precise_sample(render_url, kv_port)))
    return path


async def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


@pytest.fixture
async def servers() -> AsyncIterator[tuple[list[SimServer], int]]:
    kv_port = free_port()
    started = []
    try:
        for i in (1, 2, 3):
            config = ServerConfig(name=f"s{i}", host=f"127.10.0.{i}", port=0, speed=50.0, kv_events_port=kv_port)
            server = SimServer(config)
            await server.start()
            started.append(server)
        yield started, kv_port
    finally:
        for server in started:
            await server.stop()


async def _pick(stub: Any, path: str, body: dict[str, Any]) -> str:
    raw = json.dumps(body).encode()
    messages = [headers_msg(path=path), body_msg(raw, True)]

    async def requests() -> AsyncIterator[pb.ProcessingRequest]:
        for message in messages:
            yield message

    call = stub.Process(requests(), timeout=30)
    async for response in call:
        if response.WhichOneof("response") == "request_headers":
            call.cancel()
            return destination(response)
    raise AssertionError("no decision")


async def test_completions_and_chat_are_rendered_and_matched_against_the_engines_events(
    tmp_path: Path, servers: tuple[list[SimServer], int]
) -> None:
    sims, kv_port = servers
    render = sims[0]
    grpc_port, metrics_port = free_port(), free_port()
    endpoints = ",".join(s.address for s in sims)
    config = _config(tmp_path, f"http://{render.address}", kv_port)
    argv = serve_argv(
        grpc_port, free_port(), metrics_port, "--static-endpoints", endpoints, "--config-file", str(config)
    )
    base = f"http://127.0.0.1:{metrics_port}"
    with running(argv, tmp_path / "serve.log") as proc:
        await _until(lambda: proc.poll() is None and http_ok(f"{base}/readyz"), "epp serve never became ready")
        async with aiohttp.ClientSession() as http:
            await until_every_publisher_heard(http, base, sims)

            # each prompt cached on one server by a request straight to it: the picker never saw these prompts
            cases = [
                ("/v1/completions", _completion(1)),
                ("/v1/chat/completions", _chat(2)),
                ("/v1/completions", _completion(3)),
            ]
            for server, (path, body) in zip(sims, cases, strict=True):
                before = metric_value(http_text(f"{base}/metrics"), INDEXED)
                async with http.post(f"http://{server.address}{path}", json=body) as r:
                    assert r.status == 200, await r.text()
                await _until(
                    lambda before=before: metric_value(http_text(f"{base}/metrics"), INDEXED) > before,
                    f"{server.address}'s stores never reached the picker's index",
                )

        credentials = grpc.ssl_channel_credentials(root_certificates=presented_certificate(grpc_port))
        options = [("grpc.ssl_target_name_override", SELF_SIGNED_NAME)]
        renders = render.render_calls
        async with grpc.aio.secure_channel(f"127.0.0.1:{grpc_port}", credentials, options=options) as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            picked = [await _pick(stub, path, body) for path, body in cases]
        assert picked == [s.address for s in sims]
        assert render.render_calls == renders + len(cases)  # one render call per request, through the sidecar URL

        text = http_text(f"{base}/metrics")
        for reason in ("absent", "stale", "no_tokens"):  # every endpoint's match came from the events
            assert metric_value(text, f'llm_d_epp_precise_prefix_fallbacks_total{{reason="{reason}"}}') == 0, reason
        pool = json.loads(http_text(f"{base}/debug/pool"))["kvEvents"]["endpoints"]
        assert all(pool[s.address]["precise"] for s in sims)
    # stopped: the feeder child closed its shared memory without a traceback (a view left open, or the resource
    # tracker asked to forget a name twice, used to print one per segment)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
