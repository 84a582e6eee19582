"""SLO-aware routing through a real Envoy, on the picker's own latency model: two simulators, a fast one (H100
profile) and a slow one (L4 profile), `epp serve` with upstream's SLO plugins and `latency-slo-admitter`.

- After warm-up requests placed on each (the conformance header), the model knows the slow one is slower: a loose
  `x-llm-d-slo-ttft-ms` is packed onto the slow endpoint (upstream's `least` headroom: the fast one kept for tight
  objectives), a tight one goes to the fast endpoint.
- With both endpoints busy (a long stream in flight on each), a sheddable request whose objective no endpoint can
  meet gets upstream's 429 and drop reason; a critical one with the same objective is served.

The simulators run 10× real time; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from epp import wire
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.profiles import H100_LLAMA_8B, L4_LLAMA_8B
from epp.sim.server import SERVER_HEADER, SimServer
from tests.support.envoy import envoy
from tests.support.procs import free_port, http_ok, http_text, running, serve_argv

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.process,
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: slo-headroom-tier-filter
  parameters: {epsilonExploreNeg: 0}
- type: latency-scorer
- type: latency-slo-admitter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: slo-headroom-tier-filter}, {pluginRef: latency-scorer}, {pluginRef: max-score-picker}]
"""
OBJECTIVES = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: pool}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: pool}}
"""
OBJECTIVE = "x-llm-d-inference-objective"
WARMUP = 24  # requests placed on each endpoint before the SLO tests


def _prompt(seed: int, chars: int = 4000) -> str:
    return "".join(f"w{seed:05d}-{i:06d} " for i in range(chars // 14 + 1))[:chars]


async def _until(condition: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


@dataclass
class World:
    fast: SimServer
    slow: SimServer
    gateway: str
    metrics: str
    http: aiohttp.ClientSession

    def observations(self) -> int:
        models = json.loads(http_text(f"{self.metrics}/debug/pool")).get("latencyModels", {})
        return sum(int(m["observations"]) for m in models.values())

    async def complete(
        self, prompt: str, headers: dict[str, str] | None = None, max_tokens: int = 2
    ) -> tuple[int, str, dict[str, str]]:
        body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        async with self.http.post(f"{self.gateway}/v1/completions", json=body, headers=headers or {}) as r:
            await r.read()
            return r.status, r.headers.get(SERVER_HEADER, ""), dict(r.headers)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=[1, 2], ids=["workers1", "workers2"])
async def world(request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path) -> AsyncIterator[World]:
    """One picker process, or two serving workers: then each worker picks on its own model and the control
    process's /debug/pool shows their sum (`Metrics.learned`), which the warm-up waits for."""
    workers = str(request.param)
    sims = [
        SimServer(ServerConfig(name="fast", host="127.10.0.1", profile=H100_LLAMA_8B, speed=10.0)),
        SimServer(ServerConfig(name="slow", host="127.10.0.2", profile=L4_LLAMA_8B, speed=10.0)),
    ]
    with contextlib.ExitStack() as stack:
        try:
            for sim in sims:
                await sim.start()
            config, objectives = e2e_tmp / "slo.yaml", e2e_tmp / "slo-objectives.yaml"
            config.write_text(CONFIG)
            objectives.write_text(OBJECTIVES)
            grpc_port, metrics_port = free_port(), free_port()
            argv = serve_argv(
                grpc_port, free_port(), metrics_port, "--static-endpoints", ",".join(s.address for s in sims),
                "--config-file", str(config), "--objectives-file", str(objectives),
                "--enable-test-endpoint-selection", "--workers", workers, "--grace-period", "1",
            )  # fmt: skip
            proc = stack.enter_context(running(argv, e2e_tmp / f"picker-slo-{workers}.log"))
            ready = f"http://127.0.0.1:{metrics_port}/readyz"
            await _until(lambda: proc.poll() is None and http_ok(ready), "the picker never became ready", 60)
            port = stack.enter_context(envoy(e2e_tmp, grpc_port, "FULL_DUPLEX_STREAMED"))
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                w = World(sims[0], sims[1], f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", http)
                for i in range(WARMUP):
                    for sim in sims:
                        headers = {wire.TEST_ENDPOINT_SELECTION_HEADER: sim.address}
                        status, served, _ = await w.complete(_prompt(i * 2 + (sim is sims[1])), headers)
                        assert status == 200 and served == sim.config.name
                await _until(lambda: w.observations() >= 2 * WARMUP, "the warm-up was never observed")
                yield w
        finally:
            for sim in sims:
                await sim.stop()


async def test_the_ttft_objective_changes_the_pick(world: World) -> None:
    loose = [(await world.complete(_prompt(1000 + i), {wire.SLO_TTFT_HEADERS[0]: "2000"}))[1] for i in range(6)]
    tight = [(await world.complete(_prompt(2000 + i), {wire.SLO_TTFT_HEADERS[0]: "25"}))[1] for i in range(6)]
    assert loose.count("slow") >= 5, loose  # every endpoint meets it: packed onto the one closest to the objective
    assert tight.count("fast") >= 5, tight  # only the fast endpoint meets it


async def test_a_sheddable_request_no_endpoint_can_serve_in_time_gets_429(world: World) -> None:
    long_streams = [
        asyncio.create_task(
            world.complete(_prompt(3000 + i, 60_000), {wire.TEST_ENDPOINT_SELECTION_HEADER: sim.address}, 4000)
        )
        for i, sim in enumerate((world.fast, world.slow))
    ]
    try:
        pool = f"{world.metrics}/debug/pool"

        def both_busy() -> bool:
            endpoints = json.loads(http_text(pool))["endpoints"]
            return all(
                e.get("inflight", 0) > 0 and (e.get("metrics", {}).get("kvCacheUsage") or 0) >= 0.02 for e in endpoints
            )

        await _until(both_busy, "both endpoints never showed the long streams", 20)
        hopeless = {wire.SLO_TTFT_HEADERS[0]: "0.001"}
        status, _, headers = await world.complete(_prompt(4000), {**hopeless, OBJECTIVE: "batch"})
        assert status == 429
        assert headers.get(wire.DROPPED_REASON_HEADER) == wire.REJECTED_SATURATED
        status, _, _ = await world.complete(_prompt(4001), {**hopeless, OBJECTIVE: "critical"})
        assert status == 200
    finally:
        for task in long_streams:
            task.cancel()
        await asyncio.gather(*long_streams, return_exceptions=True)
