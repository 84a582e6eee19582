"""Flow-control dispatch cost per queued request: one process vs serving workers, side by side in one run.

The same saturated workload three ways: (a) one process, its streams holding on the `FlowGate` directly; (b) one
and (c) two serving-worker processes whose streams hold on the control process's gate over a pipe
(`epp.director.flow_link` → `epp.app.flow_host`), each worker's picks in flight in a shared matrix the control
sums on each `Decided` and, while requests wait, every 5 ms (`epp.app.flow_host.RELEASE_POLL_S`), as
`epp serve --workers N` does.

The pool holds `--capacity` requests (concurrency-detector); `--streams` streams per process each send requests
back to back, each held for `--service-ms` once dispatched, so nearly every request waits in the queue. Reported
per request: the wall time, and the CPU time of every process of the run (control + workers) — the dispatch
cost. Bounded: `--requests` per mode, `--seconds` at most per mode; no socket is opened (pipes only).

    .venv/bin/python -m benchmarks.flow_workers --requests 3000 --streams 8 --capacity 4 --service-ms 1
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from contextlib import aclosing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from epp.app.flow_host import FlowHost
from epp.config.flowcontrol import FlowControlSpec
from epp.datastore import EndpointTable, Freshness
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director.flow import FlowGate
from epp.director.flow_link import CONTROL_MESSAGES, RemoteFlowGate
from epp.flowcontrol import FlowController, FlowSettings, Outcome
from epp.flowcontrol.gauge import PoolGauge
from epp.scheduling.saturation import ConcurrencyDetector

HEADERS = {":path": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class Args:
    requests: int
    streams: int
    capacity: int
    service_s: float
    seconds: float


class QueuedCount:
    """The gate's observer: how many dispatched requests had waited in the queue (the rest passed through)."""

    def __init__(self) -> None:
        self.queued = 0

    def flow_outcome(self, outcome: Outcome, fairness_id: str, priority: int, waited_s: float) -> None:
        if outcome is Outcome.DISPATCHED and waited_s > 0.0:
            self.queued += 1

    def flow_cycle(self, seconds: float, saturation: float) -> None:
        pass

    def flow_revocation_confirmed(self, seconds: float) -> None:
        pass


def _gate(table: EndpointTable, capacity: int, clock: Any) -> FlowGate:
    detector = ConcurrencyDetector(max_concurrency=capacity)
    spec = FlowControlSpec(default_request_ttl_s=60.0)
    gauge = PoolGauge(detector, Freshness(1e9))
    return FlowGate(FlowController(FlowSettings(spec=spec)), table, gauge, clock, observer=QueuedCount())


def _queued(gate: FlowGate) -> int:
    observer = gate.observer
    assert isinstance(observer, QueuedCount)
    return observer.queued


def _table(now: float) -> EndpointTable:
    table = EndpointTable()
    slot = table.upsert(EndpointInfo(address="127.10.0.1:8000", labels={}, pod_name="p0"))
    table.record_scrape(slot, MetricsSample(waiting=0, kv_usage=0.0), now=now)
    return table


async def _streams(hold: Any, book: Any, release: Any, count: int, streams: int, service_s: float, end: float) -> int:
    """`streams` concurrent streams sending `count` requests in all: hold, book, serve, release."""
    left = [count]

    async def stream() -> None:
        loop = asyncio.get_running_loop()
        while left[0] > 0 and loop.time() < end:
            left[0] -= 1
            async with aclosing(hold.hold(HEADERS, 100)) as held:
                async for _ in held:
                    pass
            book()
            hold.decided()
            await asyncio.sleep(service_s)
            release()
            hold.wake()

    await asyncio.gather(*(stream() for _ in range(streams)))
    return count - left[0]


async def _one_process(args: Args) -> tuple[int, int, float, float]:
    loop = asyncio.get_running_loop()
    table = _table(loop.time())
    gate = _gate(table, args.capacity, loop.time)
    gate.start()
    cpu, started = time.process_time(), time.perf_counter()
    done = await _streams(
        gate,
        lambda: table.book_pick(0),
        lambda: table.release_pick(0),
        args.requests,
        args.streams,
        args.service_s,
        loop.time() + args.seconds,
    )
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    await gate.shutdown(0)
    return done, _queued(gate), wall, cpu


def _worker(conn: Connection, index: int, shm_name: str, workers: int, args: Args, count: int) -> None:
    asyncio.run(_worker_loop(conn, index, shm_name, workers, args, count))


async def _worker_loop(conn: Connection, index: int, shm_name: str, workers: int, args: Args, count: int) -> None:
    loop = asyncio.get_running_loop()
    shm = SharedMemory(shm_name)
    matrix: np.ndarray = np.ndarray((workers, 1, 3), dtype=np.int64, buffer=shm.buf)
    link = RemoteFlowGate(conn.send, loop.time, None, False)

    go = asyncio.Event()

    def readable() -> None:
        while conn.poll():
            msg = conn.recv()
            if isinstance(msg, CONTROL_MESSAGES):
                link.receive(msg)
            else:
                go.set()

    loop.add_reader(conn.fileno(), readable)
    conn.send("ready")
    await go.wait()

    def book() -> None:
        matrix[index, 0, 0] += 1

    def release() -> None:
        matrix[index, 0, 0] -= 1

    cpu = time.process_time()
    done = await _streams(link, book, release, count, args.streams, args.service_s, loop.time() + args.seconds)
    loop.remove_reader(conn.fileno())
    conn.send(("done", done, time.process_time() - cpu))


async def _workers(args: Args, workers: int) -> tuple[int, int, float, float]:
    loop = asyncio.get_running_loop()
    table = _table(loop.time())
    gate = _gate(table, args.capacity, loop.time)
    shm = SharedMemory(create=True, size=workers * 3 * 8)
    matrix: np.ndarray = np.ndarray((workers, 1, 3), dtype=np.int64, buffer=shm.buf)
    matrix[:] = 0
    in_flight = [0]

    def sync() -> None:
        summed = matrix.sum(axis=0)
        table.set_bookings(np.array([0]), summed)
        total = int(summed[:, 0].sum())
        if total < in_flight[0]:
            gate.wake()
        in_flight[0] = total

    ctx = mp.get_context("fork")
    conns, procs = [], []
    for i in range(workers):
        ours, theirs = ctx.Pipe()
        share = args.requests // workers + (1 if i < args.requests % workers else 0)
        proc = ctx.Process(target=_worker, args=(theirs, i, shm.name, workers, args, share))
        proc.start()
        conns.append(ours)
        procs.append(proc)

    def send(worker: int, msg: Any) -> bool:
        conns[worker].send(msg)
        return True

    host = FlowHost(gate, send, sync, loop.time)
    results: list[tuple[int, float]] = []

    def readable(worker: int) -> None:
        conn = conns[worker]
        while conn.poll():
            msg = conn.recv()
            if isinstance(msg, tuple):
                results.append((msg[1], msg[2]))
                loop.remove_reader(conn.fileno())  # the worker exits next
                return
            elif msg != "ready":
                host.receive(worker, msg)

    for conn in conns:
        while not conn.poll(1.0):
            pass
        conn.recv()  # ready
    gate.start()
    for i, conn in enumerate(conns):
        loop.add_reader(conn.fileno(), readable, i)
    cpu, started = time.process_time(), time.perf_counter()
    for conn in conns:
        conn.send("go")
    while len(results) < workers:
        await asyncio.sleep(0.05)  # the control's publication pass (epp.app.workers.CHECK_S)
        sync()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    for proc in procs:
        proc.join(10)
    await gate.shutdown(0)
    shm.unlink()  # the mapping goes with the process (the matrix still views it)
    return sum(r[0] for r in results), _queued(gate), wall, cpu + sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams per process")
    parser.add_argument("--capacity", type=int, default=4, help="requests the pool holds (maxConcurrency)")
    parser.add_argument("--service-ms", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="upper bound per mode")
    parser.add_argument("--rounds", type=int, default=1)
    ns = parser.parse_args()
    args = Args(ns.requests, ns.streams, ns.capacity, ns.service_ms / 1000.0, ns.seconds)
    print(f"pid {os.getpid()}: {args}")
    print("| mode | round | requests | queued | wall µs/request | CPU µs/request (all processes) |")
    print("|---|---|---|---|---|---|")
    for r in range(ns.rounds):
        for name, run in (
            ("one process", lambda: _one_process(args)),
            ("1 worker", lambda: _workers(args, 1)),
            ("2 workers", lambda: _workers(args, 2)),
        ):
            done, queued, wall, cpu = asyncio.run(run())
            per = f"{wall / done * 1e6:,.0f} | {cpu / done * 1e6:,.0f}"
            print(f"| {name} | {r + 1} | {done} | {queued / done:.0%} | {per} |", flush=True)


if __name__ == "__main__":
    main()
