"""What an idle picker costs, process by process: `epp serve --workers N` with its scrape child, no traffic.

Issue 25 asks that every process of an idle picker stay below 2 % of a core. This measures each one's CPU
(utime + stime from /proc, 10 ms ticks) over a window after the picker is up (every worker serving, the scrape
child running, 5 s to settle), for this checkout and, with `--root DIR` (repeatable), other checkouts of the
repository (a git worktree of an older commit), alternating run by run so the machine's load falls on all alike.

    .venv/bin/python -m benchmarks.idle_children [--root DIR ...] [--workers 2] [--seconds 20] [--runs 2]
        [--endpoints 2] [--refusing] [--hostile [--after 60]]
    .venv/bin/python -m benchmarks.idle_children --instructions 400 [--root DIR ...] [--runs 2]

The endpoints answer: `--endpoints` simulated vLLM servers (`epp sim`, this checkout's, one process, on loopback)
that the picker scrapes at its default interval, so the scrape's cost is seen; `--refusing` measures instead with
one loopback endpoint that does not answer (its scrapes fail fast), which hides that cost.

`--hostile` is issue 25's set-up: before measuring, 3,000 requests with distinct 200-character model names go
through a real Envoy (2 worker threads, BUFFERED bodies, the picker over TLS) to the picker and on to the
simulators (tests/e2e/test_metrics_cardinality.py's load, 16 at a time), then the picker idles `--after` seconds
(60) and the window starts.

`--instructions N` counts instead what the idle scrape child executes per scrape, which holds still on a loaded
box where CPU % does not: the child of each checkout (`python -m epp.supervision.launch epp.scrape.child`, as the
kit starts it) runs under callgrind (user-space instructions only: the kernel's share of its syscalls is not in
it), fed by this process as its parent (the start payload at the default scrape settings, the membership of 2
endpoints, its messages read and dropped) and scraping 2 loopback servers in this process that answer the page of
an idle `epp sim` (fetched once from one, its headers as aiohttp writes them). Counting starts after 20 scrapes
(`callgrind_control -i on`, the imports and first pages left out) and stops after N more; instructions / scrapes
between the two (±1 scrape at either end). Under callgrind a round takes longer than the 50 ms interval, so
the child's clock-driven work (a Status a second, the stale sweep every 0.25 s) falls on fewer scrapes, each a
little more than without it, and more on a loaded box: compare checkouts in one run.

Bounded: no requests at all without `--hostile` (with it, 3,000 requests within 240 s); each picker runs
`--seconds` plus its start (and the load and `--after`), and it, Envoy and the simulator are stopped by their PIDs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from epp.demo.processes import free_port, serve_argv

ROOT = Path(__file__).resolve().parents[1]
START_S = 60.0  # the picker's start, every worker serving
SETTLE_S = 5.0
REFUSING = "127.10.0.1:8000"  # loopback, nothing listens: each scrape fails at once


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _report(metrics_port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=2) as r:
            report: dict[str, Any] = json.loads(r.read())
    except OSError:
        return None
    return report


def measure(
    root: Path, workers: int, seconds: float, endpoints: str, hostile_after: float | None = None
) -> dict[str, float]:
    """% of a core per process of one idle picker run from `root` (its own `epp`, this interpreter); with
    `hostile_after`, after the hostile load and that many seconds."""
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = serve_argv(grpc_port, health_port, metrics_port, "--static-endpoints", endpoints,
                      "--workers", str(workers))  # fmt: skip
    argv[0] = sys.executable
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_S
        while True:
            report = _report(metrics_port)
            workers_up = report is not None and all(w["serving"] for w in report.get("workers", []))
            if report is not None and workers_up and report.get("scrapeProcess", {}).get("pid"):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the picker from {root} did not start")
            time.sleep(0.5)
        if hostile_after is not None:
            _hostile_load(grpc_port)
            time.sleep(hostile_after)
        time.sleep(SETTLE_S)
        pids = {"control": proc.pid, "scrape child": int(report["scrapeProcess"]["pid"])}
        pids.update({f"worker {w['worker']}": int(w["pid"]) for w in report.get("workers", [])})
        before = {name: _ticks(pid) for name, pid in pids.items()}
        time.sleep(seconds)
        after = {name: _ticks(pid) for name, pid in pids.items()}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    hz = os.sysconf("SC_CLK_TCK")
    return {name: round(100 * (after[name] - before[name]) / hz / seconds, 2) for name in pids}


class _Page(asyncio.Protocol):
    """A metrics endpoint for `--instructions`: the same page on every GET, the GETs counted (all endpoints)."""

    served = 0

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.pending = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.pending += data
        while b"\r\n\r\n" in self.pending:
            _, self.pending = self.pending.split(b"\r\n\r\n", 1)
            _Page.served += 1
            head = (
                "HTTP/1.1 200 OK\r\nx-sim-server: sim-0\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(self.page)}\r\nDate: {email.utils.formatdate(usegmt=True)}\r\n"
                "Server: Python/3.11 aiohttp/3.14.5\r\n\r\n"
            )
            assert self.transport is not None
            self.transport.write(head.encode() + self.page)


async def _served(count: int) -> None:
    while _Page.served < count:
        await asyncio.sleep(0.005)


async def _callgrind(pid: int, switch: str) -> int:
    """Instrumentation on or off in the callgrind run `pid` (always named: without it callgrind_control acts on
    every callgrind run on the machine); the scrapes served when it answered."""
    assert pid > 0
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control", "-i", switch, str(pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if await proc.wait() != 0:
        raise RuntimeError(f"callgrind_control -i {switch} {pid} failed")
    return _Page.served


async def _count_scrapes(root: Path, page: bytes, scrapes: int, warmup: int = 20) -> dict[str, Any]:
    from multiprocessing.connection import Connection

    from epp.datastore.rows import NCOL
    from epp.datastore.table import EndpointInfo
    from epp.scrape.child import Members, ScrapeStart
    from epp.scrape.engines import EngineRegistry
    from epp.scrape.scraper import ScrapeSettings
    from epp.supervision.memory import new_memfd
    from epp.supervision.messages import Start, Stop

    rows = 65536  # the picker's default block (ScrapeProcess's max_endpoints)
    loop = asyncio.get_running_loop()
    _Page.served = 0
    servers = [await loop.create_server(lambda: _Page(page), "127.0.0.1", 0) for _ in range(2)]
    addresses = [f"127.0.0.1:{server.sockets[0].getsockname()[1]}" for server in servers]
    block, stamps = new_memfd("rows", rows * NCOL * 8), new_memfd("stamps", (rows + 1) * 8)
    ours, theirs = socket.socketpair()
    with tempfile.TemporaryDirectory(prefix="idle-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                sys.executable, "-m", "epp.supervision.launch", "epp.scrape.child", str(theirs.fileno()),
                str(os.getpid()), str(block), str(stamps)]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=root, pass_fds=(theirs.fileno(), block, stamps), stderr=subprocess.DEVNULL)
        theirs.close()
        os.close(block)
        os.close(stamps)
        ours.setblocking(True)
        conn = Connection(ours.detach())
        try:
            conn.send(Start(ScrapeStart(ScrapeSettings(), EngineRegistry(), rows), logging.WARNING))
            conn.send(Members([(i, float(i), EndpointInfo(a)) for i, a in enumerate(addresses)]))

            def drop() -> None:
                try:
                    while conn.poll():
                        conn.recv()
                except (EOFError, OSError):
                    loop.remove_reader(conn.fileno())

            loop.add_reader(conn.fileno(), drop)
            await asyncio.wait_for(_served(warmup), START_S * 3)
            first = await _callgrind(proc.pid, "on")
            await asyncio.wait_for(_served(first + scrapes), START_S * 5)
            last = await _callgrind(proc.pid, "off")
            loop.remove_reader(conn.fileno())
            conn.send(Stop())
            await asyncio.wait_for(asyncio.to_thread(proc.wait), 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            conn.close()
            for server in servers:
                server.close()
        totals = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
        assert totals is not None
    return {"scrapes": last - first, "instructions_per_scrape": round(int(totals.group(1)) / (last - first))}


def instructions(roots: list[Path], runs: int, scrapes: int) -> None:
    with simulators(1) as address, urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        page = r.read()  # an idle simulator's page: every scrape of it the same bytes
    for run in range(runs):
        for root in roots if run % 2 == 0 else reversed(roots):
            counted = asyncio.run(_count_scrapes(root, page, scrapes))
            print(json.dumps({"root": str(root), "run": run, **counted}), flush=True)


def _hostile_load(grpc_port: int) -> None:
    """Issue 25's load through a real Envoy in front of the picker: 3,000 requests, each naming its own
    200-character model (the e2e test's load, so the two are the same traffic)."""
    from tests.e2e.test_metrics_cardinality import load
    from tests.support.envoy import envoy

    with (
        tempfile.TemporaryDirectory(prefix="idle-hostile-") as tmp,
        envoy(Path(tmp), grpc_port, "BUFFERED", workers=2) as port,
    ):
        statuses = asyncio.run(load(f"http://127.0.0.1:{port}"))
    print(f"# hostile load: {len(statuses)} answers, statuses {sorted(set(statuses))}", flush=True)


@contextlib.contextmanager
def simulators(count: int, speed: float = 1.0) -> Iterator[str]:
    """`count` answering vLLM simulators on loopback (one `epp sim` process, `speed` simulated seconds per second);
    their addresses, comma-joined."""
    base = free_port()
    while not all(_port_free(base + i) for i in range(count)):
        base = free_port()
    argv = [sys.executable, "-m", "epp", "sim", "--servers", str(count), "--base-port", str(base),
            "--host", "127.0.0.1", "--speed", str(speed)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addresses = [f"127.0.0.1:{base + i}" for i in range(count)]
    try:
        deadline = time.monotonic() + START_S
        while not all(_answers(a) for a in addresses):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the simulators did not start")
            time.sleep(0.2)
        yield ",".join(addresses)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", type=Path, default=[], help="another checkout to measure")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--endpoints", type=int, default=2, help="answering simulated endpoints")
    parser.add_argument("--refusing", action="store_true", help="one endpoint that does not answer instead")
    parser.add_argument("--hostile", action="store_true", help="issue 25's hostile load first (needs Envoy)")
    parser.add_argument("--after", type=float, default=60.0, help="with --hostile: seconds idle before measuring")
    parser.add_argument("--instructions", type=int, metavar="N", help="the scrape child's instructions per scrape")
    args = parser.parse_args()
    roots = [ROOT, *args.root]
    if args.instructions:
        print(f"# benchmarks/idle_children.py --instructions {args.instructions}: the idle scrape child under "
              f"callgrind, 2 endpoints, load {os.getloadavg()[0]:.1f}")  # fmt: skip
        instructions(roots, args.runs, args.instructions)
        return
    pool = "one refusing endpoint" if args.refusing else f"{args.endpoints} answering endpoints"
    if args.hostile:
        pool += f", {args.after:g} s after 3,000 hostile model names through Envoy"
    print(f"# benchmarks/idle_children.py on {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {pool}: "
          "% of a core")  # fmt: skip
    with contextlib.ExitStack() as stack:
        endpoints = (
            REFUSING
            if args.refusing
            else stack.enter_context(simulators(args.endpoints, 50.0 if args.hostile else 1.0))
        )
        for run in range(args.runs):
            for root in roots if run % 2 == 0 else reversed(roots):
                cost = measure(root, args.workers, args.seconds, endpoints, args.after if args.hostile else None)
                print(json.dumps({"root": str(root), "run": run, **cost}), flush=True)


if __name__ == "__main__":
    main()
