"""What each ext_proc phase costs the picker: its CPU per request through a real Envoy, side by side in one run.

Every configuration is rendered by `epp envoy-config` (only --response-phases / --body-mode differ) and driven
with the same streamed chat requests whose answers are Server-Sent Events of --chunks chunks. The figure that
matters is the picker's own CPU time (utime+stime from /proc) per request; the client, Envoy and the backend run
in other processes. Bounded: --requests per configuration and --max-seconds each, whichever comes first.

    .venv/bin/python benchmarks/phases.py --requests 300 --chunks 500 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from epp.cli.flag_types import duration, positive_duration
from epp.demo.processes import free_port, http_ok, port_open, wait_until
from epp.demo.processes import running as _running
from epp.gateway.binary import find_envoy

ROOT = Path(__file__).resolve().parents[1]


def running(argv: list[str], log: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    return _running(argv, log, cwd=ROOT)


CONFIGS = [
    # name, --body-mode, --response-phases
    ("buffered, no response phases", "BUFFERED", "none"),
    ("buffered, response headers (default)", "BUFFERED", "headers"),
    ("buffered, response headers + streamed body", "BUFFERED", "body"),
    ("full-duplex, response headers", "FULL_DUPLEX_STREAMED", "headers"),
    ("full-duplex both ways (upstream's setup)", "FULL_DUPLEX_STREAMED", "body"),
]


def backend_main(port: int, chunks: int, interval_s: float) -> None:
    """An SSE model-server stand-in: `chunks` small events `interval_s` apart (a model emits tokens over time, so
    each one reaches Envoy, and the picker, as its own body chunk), then usage and [DONE]."""

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(chunks):
            event = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(interval_s)
        usage = {"prompt_tokens": 7, "completion_tokens": chunks, "total_tokens": chunks + 7}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def messages_sent(admin: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=ext_proc.epp.stream_msgs_sent$") as r:
        return int(r.read().decode().rsplit(":", 1)[1])


@dataclass
class Result:
    name: str
    requests: int
    failed: int
    wall_s: float
    picker_cpu_s: float
    idle_cpu_per_s: float  # the picker's own background cost (loop, health, metrics), measured before the load
    messages: int  # ext_proc messages Envoy sent the picker during the load (its own counter)

    @property
    def cpu_us_per_request(self) -> float:
        busy = self.picker_cpu_s - self.idle_cpu_per_s * self.wall_s
        return max(busy, 0.0) / max(self.requests, 1) * 1e6


async def drive(url: str, requests: int, concurrency: int, max_seconds: float) -> tuple[int, int, float]:
    body = json.dumps({"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hello"}]})
    deadline = time.monotonic() + max_seconds
    counter = iter(range(requests))
    done = failed = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, failed
        for _ in counter:
            if time.monotonic() >= deadline:
                return
            try:
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    payload = await r.read()
                    ok = r.status == 200 and payload.endswith(b"data: [DONE]\n\n")
                    why = f"HTTP {r.status}: {payload[-200:]!r}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                ok, why = False, repr(exc)
            done += 1
            if not ok:
                failed += 1
                if failed == 1:
                    print(f"  first failure: {why}", file=sys.stderr)

    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return done, failed, time.monotonic() - started


def run_config(tmp: Path, name: str, body_mode: str, phases: str, backend: str, args: argparse.Namespace) -> Result:
    grpc_port, metrics_port, listen, admin = free_port(), free_port(), free_port(), free_port()
    pool = tmp / "pool.yaml"
    pool.write_text(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: bench}\n"
        f"spec: {{selector: {{matchLabels: {{app: bench}}}}, targetPorts: [{{number: {backend.split(':')[1]}}}],"
        " endpointPickerRef: {name: epp, failureMode: FailClose}}\n"
    )
    config = tmp / f"envoy-{listen}.yaml"
    subprocess.run(
        [sys.executable, "-m", "epp", "envoy-config", "--pool-file", str(pool), "--epp", f"127.0.0.1:{grpc_port}",
         "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}", "--endpoints", backend,
         "--body-mode", body_mode, "--response-phases", phases, "--message-timeout", "30", "-o", str(config)],
        check=True, cwd=ROOT,
    )  # fmt: skip
    picker_argv = [
        sys.executable, "-m", "epp", "serve", "--bind-address", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--grpc-health-port", str(free_port()), "--metrics-port", str(metrics_port),
        "--static-endpoints", backend, "-v", "0",
        "--workers", "1",  # one process: the CPU figure is this process's (serving workers are the default)
    ]  # fmt: skip
    envoy_argv = [str(find_envoy()), "-c", str(config), "--disable-hot-restart", "-l", "error", "--concurrency", "1"]
    with running(picker_argv, tmp / f"picker-{listen}.log") as picker:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp serve", picker)
        with running(envoy_argv, tmp / f"envoy-{listen}.log") as envoy:
            wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "envoy", envoy)
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"
            asyncio.run(drive(url, 20, 4, 10))  # warm-up: connections, caches
            idle_start, idle_cpu = time.monotonic(), cpu_seconds(picker.pid)
            time.sleep(args.idle_seconds)
            idle_rate = (cpu_seconds(picker.pid) - idle_cpu) / (time.monotonic() - idle_start)
            sent_before = messages_sent(admin)
            before = cpu_seconds(picker.pid)
            done, failed, wall = asyncio.run(drive(url, args.requests, args.concurrency, args.max_seconds))
            cpu = cpu_seconds(picker.pid) - before
            sent = messages_sent(admin) - sent_before
    return Result(name, done, failed, wall, cpu, idle_rate, sent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=500, help="SSE chunks per response")
    parser.add_argument("--chunk-interval-ms", type=float, default=1.0, help="pause between SSE chunks")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-seconds", type=positive_duration, default=60.0, help="per configuration")
    parser.add_argument("--idle-seconds", type=duration, default=5.0, help="idle CPU sampling before each load")
    parser.add_argument("--only", help="run only the configurations whose name contains this")
    parser.add_argument("--backend", type=int, help=argparse.SUPPRESS)  # internal: run as the SSE backend
    args = parser.parse_args()
    if args.backend:
        backend_main(args.backend, args.chunks, args.chunk_interval_ms / 1000)
        return 0
    if find_envoy() is None:
        print("no Envoy binary: run `make install`", file=sys.stderr)
        return 1
    port = free_port()
    backend = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="epp-phases-") as tmp_name:
        tmp = Path(tmp_name)
        backend_argv = [sys.executable, __file__, "--backend", str(port), "--chunks", str(args.chunks)]
        backend_argv += ["--chunk-interval-ms", str(args.chunk_interval_ms)]
        with running(backend_argv, tmp / "backend.log") as proc:
            wait_until(lambda: port_open(port), 15, "backend", proc)
            chosen = [c for c in CONFIGS if not args.only or args.only in c[0]]
            results = [run_config(tmp, name, body, phases, backend, args) for name, body, phases in chosen]
    base = results[0].cpu_us_per_request
    print(
        f"{args.requests} streamed requests x {args.chunks} SSE chunks ({args.chunk_interval_ms} ms apart), "
        f"concurrency {args.concurrency}; picker CPU from /proc (10 ms ticks)"
    )
    print(
        f"{'configuration':45} {'done':>5} {'fail':>5} {'req/s':>7} {'idle CPU %':>10} "
        f"{'msgs/req':>8} {'picker CPU µs/req':>18} {'vs first':>9}"
    )
    for r in results:
        print(
            f"{r.name:45} {r.requests:5d} {r.failed:5d} {r.requests / r.wall_s:7.1f} {r.idle_cpu_per_s * 100:10.2f} "
            f"{r.messages / max(r.requests, 1):8.1f} {r.cpu_us_per_request:18.0f} {r.cpu_us_per_request / base:8.2f}x"
        )
    print("picker CPU µs/req = (CPU during the load - idle CPU rate x load seconds) / requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
