"""The event loop every process of the picker runs on: the control process, its serving workers and its feeders."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """uvloop when installed (a runtime dependency on Linux): grpc.aio's callbacks and the stream tasks cost
    measurably less per request on it (benchmarks/RESULTS.md), and a feeder's wake-ups less each (libuv's loop
    turn is C; asyncio's is Python); plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def wait_set(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` has passed, whichever comes first; on the timeout the event is set
    (the caller clears it when it means to wait again).

    Every loop of the picker that waits "for a change, or at the latest in N seconds" waits here. Not
    `asyncio.wait_for(event.wait(), timeout_s)`: on Python 3.11 wait_for drops a cancel that lands in the loop turn
    the event is set, so a task stopped at that moment runs on and whoever awaits its end (a shutdown) waits for
    ever. A timer that sets the event passes every cancel through, and makes no task per wait."""
    timer = asyncio.get_running_loop().call_later(max(timeout_s, 0.0), event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()
