"""`/debug/stacks`: every thread and asyncio task of the picker, only when `--enable-pprof` asks for it."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from epp.app.http import build_http_app
from epp.observability.stacks import dump_stacks


async def _parked_stream_task(started: asyncio.Event) -> None:
    started.set()
    await asyncio.sleep(3600)


def test_the_dump_names_every_thread_and_task() -> None:
    async def main() -> str:
        started = asyncio.Event()
        task = asyncio.create_task(_parked_stream_task(started), name="stream-42")
        await started.wait()
        try:
            return dump_stacks()
        finally:
            task.cancel()

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="watch-pods", daemon=True)
    worker.start()
    try:
        text = asyncio.run(main())
    finally:
        stop.set()
    assert "thread watch-pods" in text and "thread MainThread" in text
    assert "task stream-42 (_parked_stream_task)" in text
    assert "await asyncio.sleep(3600)" in text  # the frame it waits in


async def _get(app: web.Application, path: str) -> tuple[int, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
            return response.status, await response.text()
    finally:
        await runner.cleanup()


async def test_served_only_with_enable_pprof() -> None:
    def app(stacks: bool) -> web.Application:
        return build_http_app(CollectorRegistry(), dict, lambda: True, stacks=stacks)

    status, text = await _get(app(True), "/debug/stacks")
    assert status == 200 and "# asyncio tasks:" in text
    status, _ = await _get(app(False), "/debug/stacks")
    assert status == 404


async def test_heap_growth_between_two_calls_when_tracemalloc_traces() -> None:
    import tracemalloc

    from epp.observability.stacks import dump_heap

    app = build_http_app(CollectorRegistry(), dict, lambda: True, stacks=True)
    status, text = await _get(app, "/debug/heap")
    assert status == 200 and "tracemalloc is off" in text
    tracemalloc.start(1)
    try:
        dump_heap()
        kept = [bytearray(1024) for _ in range(200)]  # ~200 KiB that stays
        text = dump_heap()
    finally:
        tracemalloc.stop()
    assert "# growth since the previous call" in text and "test_debug_stacks.py" in text
    assert kept
