"""The KV-events feeder as `epp serve` runs it: a supervised child process fed membership from the endpoint table,
its index read by the serving side in place; simulators publish real events over ZMQ on loopback.

The precise producer stops steering a prefix to a server whose cache was reset (the approximate producer still
would), marks a server whose event stream stopped as stale so its match falls back to the approximate one, and a
killed feeder is restarted and leaves nothing in /dev/shm."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epp.app.kv_feeder import KvFeederProcess, sources_of
from epp.app.kv_metrics import KvEventsCollector, PreciseFallbacksCollector
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.kvevents import kernels
from epp.scheduling.framework import CycleState, produced
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.producers import TokenProducer
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.server import SimServer
from epp.sim.tokens import token_ids
from tests.scheduling.tables import request
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.timeout(90)


def _prompt(seed: int, chars: int = 4000) -> str:
    return " ".join(f"w{seed}-{i:05d}" for i in range(chars // 8 + 1))[:chars]


async def _until(condition: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _pick_state(table: EndpointTable, prompt: str, now: float) -> CycleState:
    snap = table.snapshot()
    st = CycleState(snap, snap.slots, request(prompt, token_ids=tuple(token_ids(prompt))), now)
    TokenProducer(backend="vllm", model_name="m").produce(st)
    return st


def _held(feeder: KvFeederProcess, keys: Any, address: str) -> int:
    """The blocks of `keys` the feeder's table says `address` holds (0 while it has no slot)."""
    names = list(feeder.slot_names())
    return int(feeder.prefix_blocks(keys)[names.index(address)]) if address in names else 0


def test_data_parallel_ranks_follow_the_ports_of_one_pod() -> None:
    assert sources_of(["127.10.0.1:8001", "127.10.0.2:8000", "127.10.0.1:8000"]) == [
        ("127.10.0.1:8000", "127.10.0.1", 0),
        ("127.10.0.1:8001", "127.10.0.1", 1),
        ("127.10.0.2:8000", "127.10.0.2", 0),
    ]


@pytest.mark.process
async def test_reset_stale_stream_and_restart_through_the_feeder_process(http: aiohttp.ClientSession) -> None:
    kv_port = free_port()
    servers = []
    for i in (1, 2):
        server = SimServer(ServerConfig(name=f"s{i}", host=f"127.10.0.{i}", port=0, speed=50.0, kv_events_port=kv_port))
        await server.start()
        servers.append(server)
    a, b = servers
    table = EndpointTable()
    for server in servers:
        table.upsert(EndpointInfo(address=server.address))
    producer = PrecisePrefixCacheProducer(socket_port=kv_port, stale_after_s=1.0)
    feeder = KvFeederProcess(table, producer)
    await feeder.start()
    try:
        # ZMQ's slow joiner: reset the (empty) caches until each server's AllBlocksCleared has been indexed
        deadline = time.monotonic() + 30
        while any(feeder.last_event_at(s.address) == float("-inf") for s in servers):
            assert time.monotonic() < deadline, "the feeder never joined the publishers"
            for server in servers:
                async with http.post(f"http://{server.address}/reset_prefix_cache") as r:
                    assert r.status == 200
            await asyncio.sleep(0.2)

        prompt = _prompt(1)
        async with http.post(
            f"http://{a.address}/v1/completions", json={"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 2}
        ) as r:
            assert r.status == 200
        keys = producer.keys.request_keys(token_ids(prompt))
        await _until(lambda: _held(feeder, keys, a.address) > 0, "a's stores never reached the table")

        st = _pick_state(table, prompt, time.monotonic())
        producer.produce(st)
        slot_a = table.snapshot().addresses.index(a.address)
        slot_b = 1 - slot_a
        match = produced(st, producer.name)
        assert match.matched[slot_a] == len(keys) and match.matched[slot_b] == 0
        picked_at = st.now
        producer.picked(st, slot_a)  # the approximate producer learns the pick too

        # POST /reset_prefix_cache: the precise match goes, the approximate one stays
        async with http.post(f"http://{a.address}/reset_prefix_cache") as r:
            assert r.status == 200
        await _until(lambda: not feeder.prefix_blocks(keys).any(), "the clear never reached the table")
        await _until(lambda: feeder.last_event_at(a.address) > picked_at, "the clear's time never reported")
        st = _pick_state(table, prompt, time.monotonic())
        producer.produce(st)
        assert produced(st, producer.name).matched[slot_a] == 0
        assert produced(st, producer.approx.name).matched[slot_a] == len(keys)

        # b's event stream stops (its server goes away); it is sent work and nothing comes back
        await b.stop()
        servers.remove(b)
        sent = time.monotonic()
        st = _pick_state(table, prompt, sent)
        producer.produce(st)
        producer.picked(st, slot_b)  # a prompt b does not hold: its prefill owes us stores
        assert producer.trust(b.address, sent + 0.5) is None
        assert producer.trust(b.address, sent + 1.5) == "stale"
        report = feeder.supervision(sent + 1.5)
        assert report["up"] and report["endpoints"][b.address]["fallbackReason"] == "stale"
        assert report["endpoints"][a.address]["precise"] is True
        st = _pick_state(table, prompt, sent + 1.5)
        producer.produce(st)
        assert producer.fallbacks["stale"] >= 1
        names = {m.name for m in KvEventsCollector(feeder).collect()}
        names |= {m.name for m in PreciseFallbacksCollector(producer).collect()}  # the picking process's
        assert {"llm_d_epp_kv_cache_events_last_event_age_seconds", "llm_d_epp_precise_prefix_fallbacks"} <= names

        # the feeder dies: restarted with backoff on a fresh table (memfd: nothing in /dev/shm, ever), the index
        # rebuilt from live events
        pid = feeder.supervision(time.monotonic())["pid"]
        with open(f"/proc/{pid}/maps") as maps:
            assert "/memfd:epp-kv-table-0" in maps.read()
        os.kill(pid, signal.SIGKILL)
        await _until(lambda: feeder.restarts == 1 and feeder.up, "the feeder was not restarted")
        assert not _named_segments()
        deadline = time.monotonic() + 30
        while feeder.last_event_at(a.address) == float("-inf"):
            assert time.monotonic() < deadline, "the new feeder never joined"
            async with http.post(f"http://{a.address}/reset_prefix_cache") as r:
                assert r.status == 200
            await asyncio.sleep(0.2)
    finally:
        await feeder.stop()
        for server in servers:
            await server.stop()
    assert not _named_segments()


def _named_segments() -> list[str]:
    """Shared memory with a name the picker could leave behind (its tables are memfds: there must be none)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith("epp-")] if os.path.isdir("/dev/shm") else []


@pytest.mark.process
def test_serve_with_upstreams_precise_sample_runs_the_feeder_and_shows_freshness(tmp_path: Path) -> None:
    """deploy/config/epp-precise-prefix-cache-config.yaml loads and runs under `epp serve`: the feeder child is up,
    the endpoint (no publisher) shows as absent in /debug/pool, and the metrics are exported."""
    sample = Path(__file__).parents[1] / "data/epp-configs/llmd-router-precise-prefix-cache-config.yaml"
    metrics_port = free_port()
    argv = serve_argv(
        free_port(), free_port(), metrics_port, "--static-endpoints", "127.10.0.9:8000", "--config-file", str(sample)
    )
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)

        def kv() -> dict[str, Any]:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as response:
                return dict(json.load(response)["kvEvents"])

        wait_until(lambda: kv()["up"] and "127.10.0.9:8000" in kv()["endpoints"], 60, "feeder", proc)
        entry = kv()["endpoints"]["127.10.0.9:8000"]
        assert (entry["precise"], entry["fallbackReason"], entry["lastEventAgeSeconds"]) == (False, "absent", None)
        assert kv()["kernels"] == kernels.name()  # said once in the log too
        assert f"block keys and table lookups by the {kernels.name()} kernels" in (tmp_path / "serve.log").read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert "llm_d_epp_kv_cache_events_feeder_up 1.0" in text
        assert 'llm_d_epp_precise_prefix_fallbacks_total{reason="absent"}' in text
