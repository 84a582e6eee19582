"""Flow control end to end: a real Envoy (over TLS) in front of `epp serve` in standalone mode with the
`flowControl` gate, `--objectives-file`, and a simulated model server whose long streaming requests saturate the
pool (concurrency-detector, maxConcurrency 2). A critical request waits and is served once those requests end; a
sheddable one gets 429 `rejected-ttl-expired` after its TTL; on SIGTERM every queued request is answered (503
`rejected-shutting-down`) before the picker exits. Each runs with one process and with `--workers 2`, where the
picker's one set of queues is the control process's and the workers' streams hold on it (epp.app.flow_host).

Envoy runs with the 1 s ext_proc `message_timeout` the rendered gateway config ships (and `max_message_timeout`
30 s): every wait here is longer than that, and each is ended by the picker (served, or refused with its reason),
never by Envoy's timer, because the picker extends it while it holds the request (override_message_timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import start_picker
from tests.e2e.test_routing import CHAT, chat, post
from tests.support.envoy import envoy
from tests.support.procs import http_ok, running, wait_until

TTL_S = 4.0
MESSAGE_TIMEOUT_S = 1.0  # epp envoy-config's default
CONFIG = f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {{maxConcurrency: 2}}
- type: queue-scorer
- type: max-score-picker
flowControl:
  defaultRequestTTL: {TTL_S:g}s
  saturationDetector: {{pluginRef: concurrency-detector}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}, {{pluginRef: max-score-picker}}]
"""
OBJECTIVES = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: pool}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: pool}}
"""
OBJECTIVE = "x-llm-d-inference-objective"
LONG = chat("a long answer", stream=True, max_tokens=20000)


def _sim_address(log: Path) -> str | None:
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "sim-0":
            return parts[1]
    return None


@contextlib.contextmanager
def _stack(e2e_tmp: Path, body_mode: str, config: str, name: str, workers: int) -> Iterator[tuple[str, object]]:
    """The simulator, `epp serve --workers N` with `config` and the objectives, and Envoy in `body_mode`: (its URL,
    the picker's process)."""
    sim_argv = [sys.executable, "-m", "epp", "sim", "--servers", "1", "--base-port", "0", "--model", "m1"]
    sim_argv += ["--duration", "120"]
    (e2e_tmp / f"{name}.yaml").write_text(config)
    (e2e_tmp / "flow-objectives.yaml").write_text(OBJECTIVES)
    with running(sim_argv, e2e_tmp / f"{name}-sim.log") as sim:
        wait_until(lambda: _sim_address(e2e_tmp / f"{name}-sim.log") is not None, 60, "epp sim", sim)
        address = _sim_address(e2e_tmp / f"{name}-sim.log")
        assert address is not None
        argv, picker = start_picker(
            e2e_tmp,
            address,
            "--config-file",
            str(e2e_tmp / f"{name}.yaml"),
            "--objectives-file",
            str(e2e_tmp / "flow-objectives.yaml"),
            "--grace-period",
            "1",
            "--workers",
            str(workers),
        )
        with running(argv, e2e_tmp / f"picker-{name}.log") as proc:
            wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
            # BUFFERED as `epp envoy-config` renders it: the response body does not pass through the picker
            response_body = "" if body_mode == "FULL_DUPLEX_STREAMED" else "NONE"
            timeout = f"{MESSAGE_TIMEOUT_S:g}s"
            with envoy(e2e_tmp, picker.grpc_port, body_mode, response_body, message_timeout=timeout) as port:
                yield f"http://127.0.0.1:{port}", proc


MODES = [(mode, workers) for workers in (1, 2) for mode in ("FULL_DUPLEX_STREAMED", "BUFFERED")]
IDS = [f"{mode}-{workers}w" for mode, workers in MODES]


@pytest.fixture(params=MODES, ids=IDS)
def stack(request: pytest.FixtureRequest, e2e_tmp: Path, envoy_available: None) -> Iterator[tuple[str, object]]:
    with _stack(e2e_tmp, request.param[0], CONFIG, "flow", request.param[1]) as running_stack:
        yield running_stack


async def _saturate(session: aiohttp.ClientSession, url: str) -> list[aiohttp.ClientResponse]:
    """Two long streaming requests in flight: the pool is at its concurrency limit (saturation 1.0)."""
    longs = []
    for _ in range(2):
        r = await session.post(url + CHAT, json=LONG, headers={OBJECTIVE: "critical"})
        assert r.status == 200
        await asyncio.wait_for(r.content.readany(), 20)  # the first chunk: it is running
        longs.append(r)
    return longs


async def test_queued_requests_wait_expire_and_are_answered_on_shutdown(stack: tuple[str, object]) -> None:
    url, proc = stack
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        longs = await _saturate(session, url)
        started = time.monotonic()
        status, headers, body = await post(session, url + CHAT, chat(), {OBJECTIVE: "batch"})
        waited = time.monotonic() - started
        assert status == 429, body
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
        assert waited >= TTL_S * 0.9  # it waited its TTL in the queue, then was refused

        started = time.monotonic()
        critical = asyncio.ensure_future(post(session, url + CHAT, chat(), {OBJECTIVE: "critical"}))
        await asyncio.sleep(MESSAGE_TIMEOUT_S * 2.5)
        assert not critical.done()  # held, longer than Envoy's message_timeout: the pool is saturated
        for r in longs:  # the model server's work ends: room opens
            r.close()
        status, headers, body = await asyncio.wait_for(critical, 20)
        assert status == 200, body  # served: Envoy's per-message timer did not fail it while it was queued
        assert "x-llm-d-request-dropped-reason" not in headers
        assert time.monotonic() - started >= MESSAGE_TIMEOUT_S * 2.5

        longs = await _saturate(session, url)
        queued = [asyncio.ensure_future(post(session, url + CHAT, chat(), {OBJECTIVE: "critical"})) for _ in range(3)]
        await asyncio.sleep(0.5)
        assert not any(q.done() for q in queued)
        proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        answers = await asyncio.wait_for(asyncio.gather(*queued), 20)
        for status, headers, body in answers:
            assert status == 503, body
            assert headers["x-llm-d-request-dropped-reason"] == "rejected-shutting-down"
        for r in longs:
            r.close()
    assert await asyncio.to_thread(proc.wait, 15) == 0  # type: ignore[attr-defined]


EVICTION_CONFIG = CONFIG.replace("maxConcurrency: 2", "maxConcurrency: 1").replace(
    "flowControl:\n", "flowControl:\n  enableEviction: true\n"
)


@pytest.fixture(params=MODES, ids=IDS)
def evicting(request: pytest.FixtureRequest, e2e_tmp: Path, envoy_available: None) -> Iterator[tuple[str, object]]:
    with _stack(e2e_tmp, request.param[0], EVICTION_CONFIG, "evict", request.param[1]) as running_stack:
        yield running_stack


async def test_a_sheddable_request_in_flight_is_evicted_for_a_critical_one(evicting: tuple[str, object]) -> None:
    """enableEviction: the pool's one slot holds a sheddable streaming request; a critical request arrives, the
    sheddable one is ended (its response cut off: it had started), and the critical one is served at once."""
    url, _ = evicting
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        shed = await session.post(url + CHAT, json=LONG, headers={OBJECTIVE: "batch"})
        assert shed.status == 200
        await asyncio.wait_for(shed.content.readany(), 20)  # running
        status, headers, body = await post(session, url + CHAT, chat(), {OBJECTIVE: "critical"})
        # Served, not refused at its TTL (429 rejected-ttl-expired), while the one slot was held: it took the
        # sheddable request's place, whose response had not ended on its own when this one was answered.
        assert status == 200, body
        assert "x-llm-d-request-dropped-reason" not in headers
        assert not shed.content.at_eof()
        with pytest.raises(aiohttp.ClientPayloadError):  # the evicted response was cut off
            await asyncio.wait_for(shed.read(), 20)
        shed.close()
