"""The open-loop generator: every planned request ends as exactly one outcome — answered, failed or unfinished."""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from epp.demo.load import Progress, Shot, drive
from epp.sim.server import SERVER_HEADER

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def backend() -> AsyncIterator[str]:
    """/ok streams two chunks, /fail answers 500, /hang never answers."""

    async def ok(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={SERVER_HEADER: "sim-7"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    released = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await released.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/fail", fail)
    app.router.add_post("/hang", hang)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        released.set()
        await runner.cleanup()


async def test_every_planned_request_is_accounted_for(backend: str) -> None:
    shots = [Shot(0.0, "/ok", b"{}"), Shot(0.01, "/fail", b"{}"), Shot(0.02, "/hang", b"{}"), Shot(9.0, "/ok", b"{}")]
    out = io.StringIO()
    outcomes = await drive(backend, shots, send_s=0.5, drain_s=0.5, progress=Progress("t", 3, 0.5, out))
    ok, failed, hung, late = outcomes
    assert ok.status == 200 and ok.server == "sim-7" and ok.ttft <= ok.e2e
    assert failed.status == 500 and not failed.ok
    assert hung.status == -1 and hung.sent and math.isnan(hung.e2e)  # cancelled at the drain deadline, counted
    assert not late.sent  # planned after the send window: never started
    assert "sent 3/3 done 2 failed 1" in out.getvalue()


async def test_refused_connection_is_a_failure_not_a_crash() -> None:
    from epp.demo.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    (outcome,) = await drive(url, [Shot(0.0, "/ok", b"{}")], send_s=1.0, drain_s=2.0)
    assert outcome.status == 0 and not outcome.ok
