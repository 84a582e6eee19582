"""Precise prefix-cache routing through a real Envoy: simulators publishing vLLM KV events over ZMQ, `epp serve` with
upstream's precise sample, and beside it a second picker with the approximate producer in its place, each behind
its own Envoy. Which server served is read from the simulator's own `x-sim-server` header.

- After server A's `POST /reset_prefix_cache`, a request sharing a prefix cached only on A goes, under the precise
  picker, to B (which still holds the prefix's first half), while the approximate picker, which only knows where it
  sent things, still steers it to A.
- A server whose event stream stops (its publisher paused) after it was sent work is marked stale (/debug/pool and
  the fallback metric) and the precise picker routes by the approximate match for it.

Prompts are placed with the conformance header `test-epp-endpoint-selection` (`--enable-test-endpoint-selection`),
so both pickers know the same history; every wait is bounded. The precise picker runs with one serving process and
with two workers (`--workers 2`: one feeder, its table read by both workers' producers, their picks shared through
the pick log), where both workers must take streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from epp import wire
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.server import SERVER_HEADER, SimServer
from tests.support.envoy import envoy
from tests.support.precise import precise_sample, until_every_publisher_heard
from tests.support.procs import free_port, http_ok, http_text, metric_value, running, serve_argv

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.process,
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

BLOCK_CHARS = 64 * 4  # one block of the sample's 64 tokens, at the simulator's 4 characters per token
STORED = 'llm_d_epp_kv_cache_events_blocks_total{event="stored"}'
INDEXED = "llm_d_epp_kv_cache_events_indexed_blocks"


def _text(seed: str, chars: int) -> str:
    return "".join(f"{seed}{i:07d} " for i in range(chars // 12 + 1))[:chars]


def _configs(tmp: Path, render_url: str, kv_port: int) -> tuple[Path, Path]:
    """Upstream's precise sample with our addresses (render URL, KV-events port) and a 1 s staleness; the
    approximate twin: the same file with `approx-prefix-cache-producer` feeding the scorer instead."""
    doc = precise_sample(render_url, kv_port)
    for plugin in doc["plugins"]:
        if plugin["type"] == "precise-prefix-cache-producer":
            plugin["parameters"]["staleAfter"] = "1s"
    precise = tmp / "precise.yaml"
    precise.write_text(yaml.safe_dump(doc))
    for plugin in doc["plugins"]:
        if plugin["type"] == "precise-prefix-cache-producer":
            plugin.clear()
            # blocks fixed at 64: auto-tuning would switch to the engine's 16 at the first scrape, forgetting picks
            params = {"blockSizeTokens": 64, "autoTune": False}
            plugin.update({"type": "approx-prefix-cache-producer", "parameters": params})
        if plugin["type"] == "prefix-cache-scorer":
            plugin["parameters"]["prefixMatchInfoProducerName"] = "approx-prefix-cache-producer"
    doc["dataLayer"]["sources"] = [s for s in doc["dataLayer"]["sources"] if s["pluginRef"] == "metrics-data-source"]
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] != "endpoint-notification-source"]
    approx = tmp / "approximate.yaml"
    approx.write_text(yaml.safe_dump(doc))
    return precise, approx


async def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


@dataclass
class World:
    a: SimServer
    b: SimServer
    c: SimServer
    precise: str  # gateway URL
    approximate: str
    precise_metrics: str
    http: aiohttp.ClientSession
    workers: int  # the precise picker's

    def metrics(self) -> str:
        return http_text(f"{self.precise_metrics}/metrics")

    def kv_endpoints(self) -> dict[str, Any]:
        return dict(json.loads(http_text(f"{self.precise_metrics}/debug/pool"))["kvEvents"]["endpoints"])

    async def complete(self, gateway: str, prompt: str, to: SimServer | None = None) -> str:
        """The simulator that served the completion (through `gateway`; to `to` when given)."""
        headers = {wire.TEST_ENDPOINT_SELECTION_HEADER: to.address} if to is not None else {}
        body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 2}
        async with self.http.post(f"{gateway}/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return r.headers[SERVER_HEADER]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=[1, 2], ids=["one-process", "two-workers"])
async def world(request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path) -> AsyncIterator[World]:
    workers = int(request.param)
    kv_port = free_port()
    sims: list[SimServer] = []
    with contextlib.ExitStack() as stack:
        try:
            for i, name in enumerate("abc", 1):
                config = ServerConfig(name=name, host=f"127.10.0.{i}", port=0, speed=50.0, kv_events_port=kv_port)
                sims.append(SimServer(config))
                await sims[-1].start()
            endpoints = ",".join(s.address for s in sims)
            precise_cfg, approx_cfg = _configs(e2e_tmp, f"http://{sims[0].address}", kv_port)
            gateways, metrics = [], []
            for name, cfg in (("precise", precise_cfg), ("approximate", approx_cfg)):
                grpc_port, metrics_port = free_port(), free_port()
                argv = serve_argv(
                    grpc_port, free_port(), metrics_port, "--static-endpoints", endpoints,
                    "--config-file", str(cfg), "--enable-test-endpoint-selection",
                    "--workers", str(workers if name == "precise" else 1),
                )  # fmt: skip
                proc = stack.enter_context(running(argv, e2e_tmp / f"picker-{name}-{workers}.log"))
                ready = f"http://127.0.0.1:{metrics_port}/readyz"
                await _until(lambda p=proc, r=ready: p.poll() is None and http_ok(r), f"{name} picker not ready")
                if name == "precise" and workers > 1:
                    pool = f"http://127.0.0.1:{metrics_port}/debug/pool"
                    await _until(
                        lambda u=pool: all(w["serving"] for w in json.loads(http_text(u))["workers"]), "workers"
                    )
                # a new connection per stream: with workers, the kernel spreads them (and their streams) over both
                gateway = envoy(e2e_tmp, grpc_port, "FULL_DUPLEX_STREAMED", streams_per_connection=1, workers=2)
                port = stack.enter_context(gateway)
                gateways.append(f"http://127.0.0.1:{port}")
                metrics.append(f"http://127.0.0.1:{metrics_port}")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                w = World(*sims, gateways[0], gateways[1], metrics[0], http, workers)
                await until_every_publisher_heard(http, metrics[0], sims)
                yield w
        finally:
            for server in sims:
                await server.stop()


async def test_after_a_cache_reset_the_precise_picker_stops_steering_to_it_the_approximate_one_does_not(
    world: World,
) -> None:
    w = world
    half = _text("x", 8 * BLOCK_CHARS)  # cached on B and A
    full = half + _text("y", 8 * BLOCK_CHARS)  # cached only on A
    stored = metric_value(w.metrics(), STORED)
    for gateway in (w.precise, w.approximate):  # both pickers book the same history
        assert await w.complete(gateway, half, to=w.b) == "b"
        assert await w.complete(gateway, full, to=w.a) == "a"
    engine_blocks = (len(half) + len(full)) // 4 // 16  # the simulator's 16-token blocks, B's and A's
    await _until(
        lambda: metric_value(w.metrics(), STORED) >= stored + engine_blocks, "the stores never reached the index"
    )
    indexed = metric_value(w.metrics(), INDEXED)

    async with w.http.post(f"http://{w.a.address}/reset_prefix_cache") as r:
        assert r.status == 200
    a_blocks = len(full) // 4 // 16
    await _until(lambda: metric_value(w.metrics(), INDEXED) <= indexed - a_blocks, "A's clear never reached the index")

    question = full + _text("q", BLOCK_CHARS // 2)
    # precise: A holds nothing any more, B the first half: B; approximate: A still "holds" all of it
    assert await w.complete(w.precise, question) == "b"
    assert await w.complete(w.approximate, question) == "a"


async def test_a_server_whose_event_stream_stops_is_marked_stale_and_routed_by_the_approximate_match(
    world: World,
) -> None:
    w = world
    assert w.c.kv_events is not None
    w.c.kv_events.lose_next = 1 << 30  # C's publisher goes silent: its batches are no longer sent
    prompt = _text("r", 16 * BLOCK_CHARS)
    assert await w.complete(w.precise, prompt, to=w.c) == "c"  # a prefill that owes stores

    def c_entry() -> dict[str, Any]:
        return dict(w.kv_endpoints()[w.c.address])

    await _until(lambda: c_entry()["fallbackReason"] == "stale", "C was never marked stale", seconds=20)
    assert c_entry()["precise"] is False
    pool = w.kv_endpoints()
    assert pool[w.a.address]["precise"] and pool[w.b.address]["precise"]
    stale = 'llm_d_epp_precise_prefix_fallbacks_total{reason="stale"}'
    before = metric_value(w.metrics(), stale)
    # no event ever told where the prompt lives; C's approximate match (the picker sent it there) decides
    served = [await w.complete(w.precise, prompt + _text(f"t{i}", 40)) for i in range(4)]
    assert served == ["c"] * 4
    # with workers, their counters reach /metrics with their next report (at most every 0.5 s)
    await _until(lambda: metric_value(w.metrics(), stale) >= before + 4, "the stale fallbacks were not counted", 5)
    if w.workers > 1:
        streams = {
            line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in w.metrics().splitlines()
            if line.startswith("epp_worker_streams_total{")
        }
        assert set(streams) == {"0", "1"} and all(n > 0 for n in streams.values()), streams
