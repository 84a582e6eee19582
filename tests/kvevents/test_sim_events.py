"""The simulator's KV events, received by the feeder over real ZMQ on loopback, rebuild the simulator's cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from epp.kvevents.feeder import Feeder, FeederSettings, KvSource
from epp.kvevents.index import KvBlockIndex
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.engine import SimRequest
from epp.sim.openai import prompt_units
from epp.sim.profiles import H100_LLAMA_8B, EngineProfile
from epp.sim.server import SimServer
from epp.sim.tokens import token_ids

pytestmark = pytest.mark.timeout(60)


def _small_profile() -> EngineProfile:
    p = H100_LLAMA_8B
    return EngineProfile(
        name="small",
        num_blocks=64,
        block_size=p.block_size,
        max_num_seqs=p.max_num_seqs,
        max_batched_tokens=p.max_batched_tokens,
        prefill_s_per_token=p.prefill_s_per_token,
        step_base_s=p.step_base_s,
        step_per_seq_s=p.step_per_seq_s,
        kv_read_s_per_token=p.kv_read_s_per_token,
    )


def _prompt(seed: int, chars: int = 1600) -> str:
    words = [f"w{seed}-{i:05d}" for i in range(chars // 8 + 1)]
    return " ".join(words)[:chars]


async def _server(name: str, *, replay: bool = False, profile: EngineProfile = H100_LLAMA_8B, hashes: str = "int"):
    server = SimServer(
        ServerConfig(
            name=name,
            port=0,
            speed=50.0,
            profile=profile,
            kv_events_port=0,
            kv_events_replay_port=0 if replay else None,
            kv_events_hash=hashes,
        )
    )
    await server.start()
    return server


def _source(server: SimServer) -> KvSource:
    assert server.kv_events is not None
    return KvSource(server.address, "127.0.0.1", port=server.kv_events.port, replay_port=server.kv_events.replay_port)


async def _complete(http: aiohttp.ClientSession, server: SimServer, prompt: str) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"http://{server.address}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


async def _pump(feeder: Feeder, until: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll the feeder (on a worker thread, one poll at a time) until the condition holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not until():
        assert loop.time() < deadline, "the index never caught up with the simulator"
        await asyncio.to_thread(feeder.poll, 20)


async def _connected(feeder: Feeder, http: aiohttp.ClientSession, *servers: SimServer) -> None:
    """A SUB gets nothing published before its subscription reaches the PUB (ZMQ's slow joiner): reset the
    (still empty) caches until each server's `AllBlocksCleared` arrives, so the test's own events are never lost."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    for server in servers:
        while (stats := feeder.stats().get(server.address)) is None or stats.batches == 0:
            assert loop.time() < deadline, "the feeder never joined the publisher"
            async with http.post(f"http://{server.address}/reset_prefix_cache") as r:
                assert r.status == 200
            await asyncio.to_thread(feeder.poll, 50)


def _cached_blocks(server: SimServer, prompt: str) -> int:
    tokens, units = prompt_units(prompt, server.config.profile.block_size)
    return server.engine.cached_units(SimRequest(0, tokens, 1, prefix=units, unit_tokens=16))


def _index_blocks(index: KvBlockIndex, server: SimServer, prompt: str) -> int:
    return index.match(index.request_keys(token_ids(prompt))).get(server.address, 0)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.parametrize("hashes", ["int", "bytes"])
async def test_index_matches_the_simulators_cache_across_servers(http: aiohttp.ClientSession, hashes: str) -> None:
    a, b = await _server("a", hashes=hashes), await _server("b", hashes=hashes)
    index = KvBlockIndex()
    feeder = Feeder(index)
    try:
        feeder.update([_source(a), _source(b)])
        await _connected(feeder, http, a, b)
        pa, pb = _prompt(1), _prompt(2)
        await _complete(http, a, pa)
        await _complete(http, b, pb)
        await _pump(feeder, lambda: index.blocks(a.address) == 25 and index.blocks(b.address) == 25)
        assert _cached_blocks(a, pa) == 25  # 1,600 characters = 400 tokens = 25 whole blocks
        assert index.match(index.request_keys(token_ids(pa))) == {a.address: 25}
        assert index.match(index.request_keys(token_ids(pb))) == {b.address: 25}
        # a prompt sharing the first 800 characters of pa: 12 whole blocks in common, on a only
        shared = pa[:800] + _prompt(3)[800:]
        assert index.match(index.request_keys(token_ids(shared))) == {a.address: 12}
        assert _cached_blocks(a, shared) == 12
    finally:
        feeder.close()
        await a.stop()
        await b.stop()


async def test_evictions_remove_index_entries_as_the_simulator_evicts(http: aiohttp.ClientSession) -> None:
    server = await _server("small", profile=_small_profile())
    index = KvBlockIndex()
    feeder = Feeder(index)
    try:
        feeder.update([_source(server)])
        await _connected(feeder, http, server)
        prompts = [_prompt(i) for i in range(5)]  # 5 × 25 blocks through a 64-block cache
        for p in prompts:
            await _complete(http, server, p)
        want = len(server.engine._units)
        await _pump(feeder, lambda: index.counters.removed_blocks > 0 and index.blocks(server.address) == want)
        assert index.counters.removed_blocks > 0
        for p in prompts:
            assert _index_blocks(index, server, p) == _cached_blocks(server, p)
    finally:
        feeder.close()
        await server.stop()


async def test_reset_prefix_cache_clears_the_endpoints_entries(http: aiohttp.ClientSession) -> None:
    server = await _server("r")
    index = KvBlockIndex()
    feeder = Feeder(index)
    try:
        feeder.update([_source(server)])
        await _connected(feeder, http, server)
        prompt = _prompt(7)
        await _complete(http, server, prompt)
        await _pump(feeder, lambda: index.blocks(server.address) == 25)
        cleared = index.counters.cleared
        async with http.post(f"http://{server.address}/reset_prefix_cache") as r:
            assert r.status == 200
        await _pump(feeder, lambda: index.counters.cleared == cleared + 1)
        assert index.blocks(server.address) == 0
        assert _index_blocks(index, server, prompt) == 0 == _cached_blocks(server, prompt)
    finally:
        feeder.close()
        await server.stop()


async def test_a_lost_batch_without_replay_drops_the_endpoints_entries(http: aiohttp.ClientSession) -> None:
    server = await _server("g")
    index = KvBlockIndex()
    feeder = Feeder(index)
    try:
        feeder.update([_source(server)])
        await _connected(feeder, http, server)
        first, lost, after = _prompt(10), _prompt(11), _prompt(12)
        await _complete(http, server, first)
        await _pump(feeder, lambda: index.blocks(server.address) == 25)
        assert server.kv_events is not None
        server.kv_events.lose_next = 1
        await _complete(http, server, lost)
        await _complete(http, server, after)
        stats = feeder.stats()[server.address]
        await _pump(feeder, lambda: stats.gaps == 1 and _index_blocks(index, server, after) == 25)
        assert stats.drops == 1
        assert _index_blocks(index, server, first) == 0  # dropped with the gap, though the server still has it
        assert _cached_blocks(server, first) == 25
    finally:
        feeder.close()
        await server.stop()


async def test_a_lost_batch_is_replayed_and_nothing_is_dropped(http: aiohttp.ClientSession) -> None:
    server = await _server("p", replay=True)
    index = KvBlockIndex()
    feeder = Feeder(index, FeederSettings(replay_timeout_s=5.0))
    try:
        feeder.update([_source(server)])
        await _connected(feeder, http, server)
        first, lost, after = _prompt(20), _prompt(21), _prompt(22)
        await _complete(http, server, first)
        await _pump(feeder, lambda: index.blocks(server.address) == 25)
        assert server.kv_events is not None
        server.kv_events.lose_next = 1
        await _complete(http, server, lost)
        await _complete(http, server, after)
        stats = feeder.stats()[server.address]
        before = stats.replays_complete  # joining may already have replayed the (empty) history
        await _pump(feeder, lambda: stats.replays_complete == before + 1 and index.blocks(server.address) == 75)
        assert (stats.gaps, stats.drops) == (1, 0)
        for p in (first, lost, after):
            assert _index_blocks(index, server, p) == 25 == _cached_blocks(server, p)
    finally:
        feeder.close()
        await server.stop()


@pytest.mark.process
async def test_the_feeder_runs_as_a_process_of_its_own(http: aiohttp.ClientSession) -> None:
    import json
    import subprocess
    import sys

    server = await _server("own")
    assert server.kv_events is not None
    argv = ["--source", f"{server.address}=127.0.0.1", "--port", str(server.kv_events.port), "--stats-interval", "0.2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.kvevents.feeder", *argv, "--duration", "20"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        for _ in range(3):  # its first stats lines: it is up, connected, and its subscription reached the publisher
            json.loads(await asyncio.to_thread(proc.stdout.readline))
        await _complete(http, server, _prompt(30))
        blocks = 0
        for _ in range(100):
            line = json.loads(await asyncio.to_thread(proc.stdout.readline))
            blocks = line["blocks"]
            if blocks:
                break
        assert blocks == 25 and line["streams"][server.address]["batches"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        await server.stop()
