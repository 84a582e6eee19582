"""The simulator's P/D roles over real HTTP: a decode server given `x-prefiller-host-port` runs llm-d's sidecar
steps (a single-token prefill leg with `kv_transfer_params` to the prefiller, then a local decode with the params
it returned); a prefiller that cannot be reached means a local prefill, never a failed request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp.sim import SimulatedPool
from epp.sim.config import DEFAULT_MODEL, ServerConfig
from epp.sim.engine import Engine, SimRequest
from epp.sim.pd import PREFILLER_HEADER
from epp.sim.profiles import H100_LLAMA_8B
from tests.support.procs import free_port

pytestmark = pytest.mark.timeout(60)

LONG = "a long uncached document " * 400  # ≈ 2,500 tokens


@pytest.fixture
async def pd_pool() -> AsyncIterator[SimulatedPool]:
    async with SimulatedPool(servers=2, base_port=0, speed=20.0, roles=("prefill", "decode")) as p:
        yield p


async def _counters(http: aiohttp.ClientSession, address: str) -> dict[str, Any]:
    async with http.get(f"http://{address}/sim/pd") as r:
        return dict(await r.json())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_decode_server_runs_the_prefill_leg_on_the_named_prefiller(pd_pool: SimulatedPool, stream) -> None:
    prefill, decode = pd_pool.servers
    assert (prefill.config.role, decode.config.role) == ("prefill", "decode")
    body = {"model": DEFAULT_MODEL, "prompt": LONG, "max_tokens": 8, "stream": stream}
    async with aiohttp.ClientSession() as http:
        headers = {PREFILLER_HEADER: prefill.address}
        async with http.post(f"http://{decode.address}/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
            await r.read()
        assert (await _counters(http, prefill.address))["prefills_served"] == 1
        seen = await _counters(http, decode.address)
    assert seen["prefill_requests"] == 1 and seen["remote_decodes"] == 1 and seen["prefill_failures"] == 0
    assert decode.engine.remote_prefills == 1
    assert prefill.engine.generation_tokens_total == 1  # the prefill leg asks for a single token


async def test_the_prefill_leg_carries_the_connector_params_and_returns_the_decode_params(pd_pool) -> None:
    prefill, _ = pd_pool.servers
    leg = {
        "model": DEFAULT_MODEL,
        "prompt": LONG,
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    async with aiohttp.ClientSession() as http, http.post(f"http://{prefill.address}/v1/completions", json=leg) as r:
        answer = await r.json()
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == prefill.config.name and params["remote_port"] == prefill.port
    assert len(params["remote_block_ids"]) == -(-answer["usage"]["prompt_tokens"] // 16)


async def test_an_unreachable_prefiller_means_a_local_prefill_not_a_failure(pd_pool) -> None:
    _, decode = pd_pool.servers
    body = {"model": DEFAULT_MODEL, "prompt": LONG, "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        headers = {PREFILLER_HEADER: f"127.0.0.1:{free_port()}"}  # nobody listens there
        async with http.post(f"http://{decode.address}/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
            assert (await r.json())["usage"]["completion_tokens"] == 4
        seen = await _counters(http, decode.address)
    assert seen["prefill_failures"] == 1 and seen["remote_decodes"] == 0
    assert decode.engine.remote_prefills == 0


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        ServerConfig(name="x", role="encode")


def test_engine_decodes_a_remotely_prefilled_prompt_without_computing_it() -> None:
    """The same 4k-token prompt: a local prefill costs ~4k tokens of compute; a remote one a single token."""

    def first_token_time(remote: bool) -> float:
        engine = Engine(H100_LLAMA_8B)
        engine.submit(SimRequest(1, 4096, 2, remote_prefill=remote), 0.0)
        return engine.begin_step(0.0)

    local, remote = first_token_time(False), first_token_time(True)
    assert local > remote + 4000 * H100_LLAMA_8B.prefill_s_per_token * 0.9
