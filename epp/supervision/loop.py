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
