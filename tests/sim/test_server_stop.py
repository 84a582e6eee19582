"""Stopping a simulated server while it still has requests: it must end at once, not wait out aiohttp's 60 s
shutdown timeout for handlers whose engine work will never finish (the demo's Ctrl-C depends on it)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from epp.sim import SimulatedPool
from epp.sim.config import DEFAULT_MODEL

pytestmark = pytest.mark.timeout(40)


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
async def test_stop_with_requests_in_flight_releases_their_handlers(stream: bool) -> None:
    pool = SimulatedPool(servers=1, base_port=0)
    await pool.start()
    server = pool.servers[0]
    body = {"model": DEFAULT_MODEL, "prompt": "x" * 4000, "max_tokens": 100_000, "stream": stream}
    async with aiohttp.ClientSession() as http:
        request = asyncio.create_task(http.post(f"http://{server.address}/v1/completions", json=body))
        while server.engine.tokens_generated(1) == 0:  # the request is running in the engine
            await asyncio.sleep(0.01)
        await asyncio.wait_for(pool.stop(), 20)  # well under aiohttp's 60 s shutdown timeout
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            (await request).close()
