"""An open-loop load generator over real sockets: planned requests sent at their planned times, whatever the
answers do, as users' traffic arrives — a closed loop would slow down exactly when a router is bad, and hide it.

Every request is a streaming OpenAI call; the time to its first body chunk is the TTFT (the simulator sends
nothing before its first token), the time to the end of the stream is the end-to-end latency, and the
simulator's `x-sim-server` header says which endpoint served it. The run is bounded twice: no request starts after
`send_s`, and whatever has not finished `drain_s` later is cancelled and counted as unfinished — never dropped
silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import aiohttp

from epp.sim.server import SERVER_HEADER


@dataclass(frozen=True, slots=True)
class Shot:
    """One planned request: when to send it (seconds after the start), where, and the JSON body."""

    at: float
    path: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int  # HTTP status; 0: no answer (connection error), -1: cancelled unfinished at the drain deadline
    ttft: float  # seconds to the first body chunk; NaN when there was none
    e2e: float  # seconds to the end of the response; NaN when unfinished
    server: str  # the simulator that served it ("" when unknown)
    sent: bool = True

    @property
    def ok(self) -> bool:
        return self.status == 200


NOT_SENT = Outcome(status=-1, ttft=float("nan"), e2e=float("nan"), server="", sent=False)


class Progress:
    """A one-line text progress bar (carriage return, no escape codes), at most a few updates a second."""

    def __init__(self, label: str, total: int, seconds: float, out: TextIO | None = None, width: int = 30) -> None:
        self.label, self.total, self.seconds, self.width = label, total, seconds, width
        self.out = out if out is not None else sys.stderr
        self.sent = self.done = self.failed = 0
        self.started = time.monotonic()
        self._shown = 0.0

    def show(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < 0.25:
            return
        self._shown = now
        elapsed = now - self.started
        fraction = min(1.0, max(self.done / max(1, self.total), elapsed / max(self.seconds, 1e-9)))
        filled = int(fraction * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        self.out.write(
            f"\r{self.label:<12} [{bar}] {elapsed:5.1f}s sent {self.sent}/{self.total} done {self.done}"
            + (f" failed {self.failed}" if self.failed else "")
        )
        self.out.flush()

    def finish(self) -> None:
        self.show(force=True)
        self.out.write("\n")
        self.out.flush()


async def _one(
    session: aiohttp.ClientSession, url: str, shot: Shot, timeout_s: float, firsts: dict[int, float], key: int
) -> Outcome:
    """One request; its TTFT also goes into `firsts[key]` at once, so a request cancelled later keeps it."""
    started = time.perf_counter()
    first = float("nan")
    try:
        async with session.post(
            url + shot.path,
            data=shot.body,
            headers={"content-type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            server = response.headers.get(SERVER_HEADER, "")
            async for chunk in response.content.iter_any():
                if chunk and first != first:  # NaN: the first chunk
                    first = firsts[key] = time.perf_counter() - started
            return Outcome(response.status, first, time.perf_counter() - started, server)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return Outcome(0, first, float("nan"), "")


async def drive(
    url: str,
    shots: Sequence[Shot],
    send_s: float,
    drain_s: float,
    progress: Progress | None = None,
    timeout_s: float = 120.0,
    connections: int = 1024,
) -> list[Outcome]:
    """Send every shot planned before `send_s` at its time; wait at most `drain_s` more; one Outcome per shot."""
    outcomes: list[Outcome] = [NOT_SENT] * len(shots)
    firsts: dict[int, float] = {}
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = loop.time()

        async def fire(i: int) -> None:
            outcome = await _one(session, url, shots[i], timeout_s, firsts, i)
            outcomes[i] = outcome
            if progress is not None:
                progress.done += 1
                progress.failed += not outcome.ok
                progress.show()

        try:
            for i, shot in enumerate(shots):
                if shot.at > send_s:
                    break
                delay = start + shot.at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(fire(i)))
                if progress is not None:
                    progress.sent += 1
                    progress.show()
            if tasks:
                remaining = max(0.0, start + max(send_s, 0.0) + drain_s - loop.time())
                await asyncio.wait(tasks, timeout=remaining)
        finally:
            for i, task in enumerate(tasks):
                if not task.done():
                    task.cancel()
                    outcomes[i] = Outcome(-1, firsts.get(i, float("nan")), float("nan"), "")
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if progress is not None:
                progress.finish()
    return outcomes


def run_phase(
    url: str,
    shots: Sequence[Shot],
    send_s: float,
    drain_s: float,
    label: str,
    out: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[Outcome], float]:
    """`drive` in its own event loop with a progress bar; returns the outcomes and the wall seconds it took."""
    planned = sum(1 for s in shots if s.at <= send_s)
    progress = Progress(label, planned, send_s, out)
    began = clock()
    outcomes = asyncio.run(drive(url, shots, send_s, drain_s, progress))
    return outcomes, clock() - began
