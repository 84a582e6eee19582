"""`epp serve --tracing` through a real Envoy, with one process and with two serving workers: every process that
decides exports its own spans (OpenTelemetry's console exporter here: each process writes its spans, with their
resource, on its own output, which is the picker's log), and with workers every worker's spans carry its index
(`epp.worker`) and pid beside the same service name.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Picker, start_picker
from tests.e2e.test_workers import debug_workers, worker_streams
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, http_ok, running, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHAT = "/v1/chat/completions"


def request_spans(log: Path) -> list[dict[str, Any]]:
    """The resource attributes of every `epp.request` span written to `log` so far (one JSON object a span, from
    a line that opens with `{`; the log lines between are skipped)."""
    text = log.read_text(errors="replace")
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    at = text.find("\n{")
    while at >= 0:
        try:
            span, end = decoder.raw_decode(text, at + 1)
        except json.JSONDecodeError:  # a span still being written
            break
        if isinstance(span, dict) and span.get("name") == "epp.request":
            out.append(dict(span["resource"]["attributes"]))
        at = text.find("\n{", end)
    return out


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def traced_gateway(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path
) -> Iterator[tuple[int, Picker, str, Path]]:
    workers = int(request.param)
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "200"}  # ms: spans out within a second
    with echo_backends(2, e2e_tmp / f"tracing-backends-{workers}.log") as backends:
        argv, picker = start_picker(e2e_tmp, ",".join(backends), "--tracing", "--workers", str(workers))
        log = e2e_tmp / f"picker-tracing-{workers}.log"
        with running(argv, log, env=env) as proc:
            wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve --tracing", proc)
            if workers > 1:
                wait_until(lambda: all(w["serving"] for w in debug_workers(picker)), 60, "every worker", proc)
            with envoy(e2e_tmp, picker.grpc_port, "BUFFERED", streams_per_connection=5, workers=2) as gateway:
                yield workers, picker, f"http://127.0.0.1:{gateway}", log


async def _burst(gateway: str, n: int) -> list[int]:
    statuses: list[int] = []
    semaphore = asyncio.Semaphore(10)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": "m1", "messages": [{"role": "user", "content": f"traced request {i}"}]}
        async with semaphore, session.post(gateway + CHAT, json=body) as r:
            await r.read()
            statuses.append(r.status)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(one(session, i) for i in range(n)))
    return statuses


async def test_every_serving_process_exports_its_own_request_spans(
    traced_gateway: tuple[int, Picker, str, Path],
) -> None:
    workers, picker, gateway, log = traced_gateway
    before = len(request_spans(log))
    statuses = await _burst(gateway, 60)
    assert statuses == [200] * 60
    deadline = time.monotonic() + 30
    while len(request_spans(log)) < before + 60:
        assert time.monotonic() < deadline, f"{len(request_spans(log)) - before} of 60 request spans exported"
        await asyncio.sleep(0.2)
    resources = request_spans(log)[before:]
    assert {r.get("service.name") for r in resources} == {"epp"}
    if workers == 1:
        assert all("epp.worker" not in r for r in resources)
        return
    streams = worker_streams(picker)
    assert set(streams) == {"0", "1"} and all(count > 0 for count in streams.values()), streams
    by_worker = {r["epp.worker"] for r in resources}
    assert by_worker == {0, 1}, by_worker  # both workers took streams, and each exported the spans of its own
    assert len({r["process.pid"] for r in resources}) == 2
