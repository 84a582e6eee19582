"""Memory and throughput over a long run: RSS at each checkpoint, the slope in bytes per request, and where it goes.

Two drivers, each bounded in requests:

- `inprocess` (default): the ext_proc state machine as `epp serve` wires it (director, default scheduling profile,
  8 endpoints with scrapes landing every 50 requests), fed Envoy's serialized messages; every request has its own
  `x-request-id` and its own prompt (a shared system prompt, then unique text), as real traffic has. No network:
  the driver is the only load on the process, so RSS moves only for the picker's own reasons.
- `serve`: a real `epp serve` process (plaintext ext_proc, static endpoints), driven over gRPC by this process
  with `--concurrency` streams in flight; the RSS is the server's. This adds grpc.aio's per-stream objects.
- `envoy`: HTTP requests through a real Envoy (ext_proc over TLS to `epp serve`, FULL_DUPLEX_STREAMED request
  phase, 8 backends that are Envoy direct responses with a vLLM `/metrics` page), `--concurrency` kept-alive
  client connections; the RSS is the picker's.

At each checkpoint: RSS (VmRSS), the prefix-cache index size (inprocess), Python objects tracked by the collector,
and the throughput of the last segment. The slope is a least-squares fit of RSS over requests, reported for the
whole run and for its second half (a plateau shows as a second-half slope near 0).

    .venv/bin/python -m benchmarks.soak [--mode inprocess|serve|envoy] [--requests 1000000] [--every 100000]
        [--concurrency 32] [--tracemalloc] [--same-body] [--plaintext] [--scraped] [--heap] [--trim]
        [--body-kib N] [--warmup 2000]

`--trim` (envoy) adds the picker's RSS after glibc's `malloc_trim(0)` at the end (through gdb): what it gives back
was free memory the allocator kept, what stays is live. `EPP_SOAK_WRAP` prefixes the picker's command (e.g.
`heaptrack -o /tmp/ht`) for a native heap profile.

`--tracemalloc` (inprocess) adds the allocation sites that grew most between the first and the last checkpoint
(slow: about 5x).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENDPOINTS = 8
SCRAPE_EVERY = 50
SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 8


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used: per-request CPU holds still when other load shares the cores."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int | None = None) -> int:
    with open(f"/proc/{pid or 'self'}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


SAME_BODY = False  # --same-body: one prompt for every request (no new prefix-cache blocks after the first)


BODY_KIB = 0  # --body-kib: pad each prompt to about this size (large bodies: many chunks per stream)
WARMUP = 2_000  # --warmup: requests before the first checkpoint


def body_of(i: int) -> bytes:
    if SAME_BODY:
        i = 0
    question = f"question {i}: " + ("why? " * (BODY_KIB * 1024 // 5) if BODY_KIB else "why? " * 40)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": messages}).encode()


def headers_message(i: int, body_length: int) -> Any:
    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    msg = pb.ProcessingRequest()
    for key, value in (
        (":authority", "127.0.0.1:10000"),
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-length", str(body_length)),
        ("content-type", "application/json"),
        ("x-request-id", f"soak-{i:012d}"),
    ):
        header = msg.request_headers.headers.headers.add()
        header.key = key
        header.raw_value = value.encode()
    msg.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    return msg


def body_message(body: bytes) -> Any:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    msg = pb.ProcessingRequest()
    msg.request_body.body = body
    msg.request_body.end_of_stream = True
    return msg


def inprocess_driver() -> tuple[Callable[[int], None], Callable[[], dict[str, Any]]]:
    """One request as a closure over a picker wired as `epp serve` wires it, and a probe of its state."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from prometheus_client import CollectorRegistry

    from epp.datastore import EndpointTable
    from epp.datastore.objectives import ObjectiveStore
    from epp.director import Director
    from epp.discovery.static import parse_static_endpoints
    from epp.extproc.server import ExternalProcessor
    from epp.extproc.stream import StreamSettings
    from epp.observability.metrics import PickerMetrics
    from epp.scheduling import build_scheduler
    from epp.scrape.engines import EngineRegistry, extract
    from tests.scrape.vllm_page import vllm_page

    addresses = [f"127.10.0.{i + 1}:8000" for i in range(ENDPOINTS)]
    table = EndpointTable()
    table.replace_all(parse_static_endpoints(",".join(addresses), ()))
    table.synced = True
    engine = EngineRegistry().for_engine("vllm")
    samples = [extract(vllm_page(waiting=i % 3, running=4 + i), engine).sample for i in range(ENDPOINTS)]
    slots = [table.slot_of(a) for a in addresses]
    metrics = PickerMetrics(CollectorRegistry())
    scheduler = build_scheduler(None, seed=1)
    director = Director(
        table, scheduler, clock=time.monotonic, observer=metrics, objectives=ObjectiveStore(),
        saturation=scheduler.saturation,
    )  # fmt: skip
    server = ExternalProcessor(director, metrics, StreamSettings(), time.perf_counter)
    decode = pb.ProcessingRequest.FromString

    def scrape() -> None:
        now = time.monotonic()
        for slot, sample in zip(slots, samples, strict=True):
            assert slot is not None
            table.record_scrape(slot, sample, now)

    def one(i: int) -> None:
        if i % SCRAPE_EVERY == 0:
            scrape()
        body = body_of(i)
        stream = server.new_stream()
        for msg in (headers_message(i, len(body)), body_message(body)):
            answers = stream.handle(decode(msg.SerializeToString()))
            if not isinstance(answers, list):  # the body asks for its decision: the pipeline, as the adapter runs it
                decide = server.pipeline.immediate
                assert decide is not None, "no render call, no flow control: nothing waits"
                answers = stream.resume(decide(answers, stream.subset))
            for answer in answers:
                answer.SerializeToString()
        stream.close()

    def probe() -> dict[str, Any]:
        index = next((getattr(s, "index", None) for s in _scorers(scheduler) if hasattr(s, "index")), None)
        return {"prefix_index_blocks": len(index) if index is not None else None}

    return one, probe


def _scorers(scheduler: Any) -> list[Any]:
    return [s.scorer for profile in scheduler.profiles for s in profile.profile.scorers]


def fit(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (KiB) over requests, in bytes per request."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return 1024 * sxy / sxx if sxx else float("nan")


def run_inprocess(requests: int, every: int, trace: bool, warmup: int = 2_000) -> dict[str, Any]:
    one, probe = inprocess_driver()
    for i in range(warmup):  # warm-up: caches, lazily built tables, first generation of the prefix index
        one(-i - 1)
    gc.collect()
    if trace:
        tracemalloc.start(8)
    first_snapshot = tracemalloc.take_snapshot() if trace else None
    checkpoints = [
        {"requests": 0, "rss_kib": rss_kib(), "req_per_s": None, **probe(), "gc_objects": len(gc.get_objects())}
    ]
    started = time.perf_counter()
    done = 0
    while done < requests:
        segment = min(every, requests - done)
        t0 = time.perf_counter()
        for i in range(done, done + segment):
            one(i)
        done += segment
        seconds = time.perf_counter() - t0
        gc.collect()
        checkpoints.append(
            {"requests": done, "rss_kib": rss_kib(), "req_per_s": round(segment / seconds), **probe(),
             "gc_objects": len(gc.get_objects())}
        )  # fmt: skip
        print(json.dumps(checkpoints[-1]), flush=True)
    result: dict[str, Any] = {"mode": "inprocess", "seconds": round(time.perf_counter() - started, 1)}
    result.update(summary(checkpoints))
    if first_snapshot is not None:
        grown = tracemalloc.take_snapshot().compare_to(first_snapshot, "lineno")[:8]
        result["grown"] = [f"{stat.size_diff / 1024:+.0f} KiB {stat.count_diff:+d}: {stat.traceback}" for stat in grown]
    return result


def summary(checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    points = [(c["requests"], c["rss_kib"]) for c in checkpoints]
    half = [p for p in points if p[0] >= points[-1][0] / 2]
    rates = [c["req_per_s"] for c in checkpoints if c["req_per_s"]]
    cpu = [c["picker_cpu_us_per_request"] for c in checkpoints if c.get("picker_cpu_us_per_request")]
    return {
        "checkpoints": checkpoints,
        "rss_growth_mib": round((points[-1][1] - points[0][1]) / 1024, 1),
        "slope_b_per_request": round(fit(points), 1),
        "slope_second_half_b_per_request": round(fit(half), 1),
        "throughput_end_vs_start": round(rates[-1] / rates[0], 3) if len(rates) >= 2 else None,
        "picker_cpu_per_request_end_vs_start": round(cpu[-1] / cpu[0], 3) if len(cpu) >= 2 else None,
    }


def _metrics_servers(count: int) -> list[Any]:
    """`count` loopback HTTP servers answering a vLLM /metrics page (threads of this process)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.scrape.vllm_page import vllm_page

    page = vllm_page(waiting=1, running=4).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(count)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return servers


def run_serve(requests: int, every: int, concurrency: int, scraped: bool = False) -> dict[str, Any]:
    import asyncio

    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from tests.support.procs import free_port, http_ok, serve_argv, wait_until

    grpc_port, metrics_port = free_port(), free_port()
    addresses = ",".join(f"127.10.0.{i + 1}:8000" for i in range(ENDPOINTS))
    if scraped:  # endpoints whose /metrics answer, so the scrape process and its rows are part of the run
        metrics_servers = _metrics_servers(ENDPOINTS)
        addresses = ",".join(f"127.0.0.1:{m.server_address[1]}" for m in metrics_servers)
    argv = serve_argv(  # one serving process: its RSS is the picker's (serving workers are the default)
        grpc_port, free_port(), metrics_port, "--static-endpoints", addresses, "--secure-serving=false",
        "--workers", "1",
    )  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp serve", proc)

        async def drive() -> list[dict[str, Any]]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = pb_grpc.ExternalProcessorStub(channel)

                refused = 0

                async def one(i: int) -> None:
                    nonlocal refused
                    body = body_of(i)
                    call = stub.Process(iter((headers_message(i, len(body)), body_message(body))))
                    async for answer in call:
                        refused += answer.WhichOneof("response") == "immediate_response"

                async def segment(start: int, count: int) -> None:
                    queue = iter(range(start, start + count))

                    async def worker() -> None:
                        for i in queue:
                            await one(i)

                    await asyncio.gather(*(worker() for _ in range(concurrency)))

                await segment(-2_000, 2_000)  # warm-up
                checkpoints = [{"requests": 0, "rss_kib": rss_kib(proc.pid), "req_per_s": None}]
                done = 0
                while done < requests:
                    count = min(every, requests - done)
                    t0 = time.perf_counter()
                    await segment(done, count)
                    done += count
                    rate = round(count / (time.perf_counter() - t0))
                    checkpoints.append(
                        {"requests": done, "rss_kib": rss_kib(proc.pid), "req_per_s": rate, "refused": refused}
                    )
                    print(json.dumps(checkpoints[-1]), flush=True)
                return checkpoints

        checkpoints = asyncio.run(drive())
    finally:
        proc.terminate()
        proc.wait(30)
    return {"mode": "serve", "scraped": scraped, "concurrency": concurrency, **summary(checkpoints)}


async def _envoy_upstream(session: Any, admin: int) -> dict[str, int]:
    """Envoy's connections and streams to the picker so far (a new connection per N streams shows here)."""
    url = f"http://127.0.0.1:{admin}/stats?filter=^cluster\\.epp\\.upstream_(cx_total|cx_active|rq_total)$"
    async with session.get(url) as response:
        text = await response.text()
    return {k.rsplit(".", 1)[1]: int(v) for k, v in (line.split(": ") for line in text.splitlines() if ": " in line)}


def _trimmed_rss(pid: int) -> int | None:
    """RSS after glibc's malloc_trim(0) in the picker (via gdb): memory it gives back was free but kept (the
    allocator's fragmentation or caching), what stays is live."""
    argv = ["gdb", "-p", str(pid), "-batch", "-ex", "call (int)malloc_trim(0)", "-ex", "detach"]
    try:
        subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rss_kib(pid)


def run_envoy_mode(
    requests: int, every: int, concurrency: int, plaintext: bool = False, heap: bool = False, trim: bool = False
) -> dict[str, Any]:
    import asyncio
    import tempfile

    import aiohttp

    from benchmarks.extproc_overhead import ANSWER, MODES, _backend_listener
    from epp.gateway.testbed import bootstrap, ext_proc_filter, listener, pool_cluster, static_cluster
    from tests.scrape.vllm_page import vllm_page
    from tests.support.envoy import run_envoy
    from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

    with tempfile.TemporaryDirectory(prefix="epp-soak-") as tmp_name:
        tmp = Path(tmp_name)
        backends = [free_port() for _ in range(ENDPOINTS)]
        epp_port, metrics_port, front = free_port(), free_port(), free_port()
        argv = serve_argv(
            epp_port, free_port(), metrics_port, "--static-endpoints",
            ",".join(f"127.0.0.1:{p}" for p in backends), "-v", "0",
            *(("--secure-serving=false",) if plaintext else ()),
            *(("--enable-pprof=true",) if heap else ()),
        )  # fmt: skip
        argv = [*os.environ.get("EPP_SOAK_WRAP", "").split(), *argv]  # e.g. a native heap profiler
        env = {**os.environ, "PYTHONTRACEMALLOC": "1"} if heap else None
        heap_report: list[str] = []
        config = bootstrap(
            [
                *(_backend_listener(f"backend{i}", port, ANSWER, vllm_page(waiting=i % 3, running=4 + i))
                  for i, port in enumerate(backends)),
                listener("epp", front, {"route": {"cluster": "pool", "timeout": "10s"}},
                         [ext_proc_filter("epp", MODES["request"])]),
            ],
            [pool_cluster(), static_cluster("epp", epp_port, http2=True, tls=not plaintext)],
            free_port(),
        )  # fmt: skip
        with running(argv, tmp / "epp.log", env) as epp, run_envoy(tmp, config, "soak") as admin:
            wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp serve", epp)
            url = f"http://127.0.0.1:{front}/v1/chat/completions"

            async def drive() -> list[dict[str, Any]]:
                statuses: dict[int, int] = {}
                connector = aiohttp.TCPConnector(limit=concurrency)
                async with aiohttp.ClientSession(connector=connector) as session:

                    async def segment(start: int, count: int) -> None:
                        queue = iter(range(start, start + count))

                        async def worker() -> None:
                            for i in queue:
                                headers = {"content-type": "application/json"}
                                async with session.post(url, data=body_of(i), headers=headers) as response:
                                    await response.read()
                                    statuses[response.status] = statuses.get(response.status, 0) + 1

                        await asyncio.gather(*(worker() for _ in range(concurrency)))

                    await segment(-WARMUP, WARMUP)
                    heap_url = f"http://127.0.0.1:{metrics_port}/debug/heap"
                    if heap:
                        async with session.get(heap_url) as response:
                            await response.text()  # the baseline the next call compares with
                    checkpoints: list[dict[str, Any]] = [
                        {"requests": 0, "rss_kib": rss_kib(epp.pid), "req_per_s": None}
                    ]
                    done = 0
                    while done < requests:
                        count = min(every, requests - done)
                        t0, cpu0 = time.perf_counter(), cpu_seconds(epp.pid)
                        await segment(done, count)
                        done += count
                        rate = round(count / (time.perf_counter() - t0))
                        cpu_us = round((cpu_seconds(epp.pid) - cpu0) / count * 1e6)
                        checkpoints.append(
                            {
                                "requests": done,
                                "rss_kib": rss_kib(epp.pid),
                                "req_per_s": rate,
                                "picker_cpu_us_per_request": cpu_us,
                                "statuses": dict(statuses),
                                **await _envoy_upstream(session, admin),
                            }
                        )
                        print(json.dumps(checkpoints[-1]), flush=True)
                    if heap:
                        async with session.get(heap_url) as response:
                            heap_report.append(await response.text())
                return checkpoints

            checkpoints = asyncio.run(drive())
            if os.environ.get("EPP_SOAK_LOG"):
                import shutil

                shutil.copy(tmp / "epp.log", os.environ["EPP_SOAK_LOG"])
            if trim:
                checkpoints[-1]["rss_kib_after_malloc_trim"] = _trimmed_rss(epp.pid)
                print(json.dumps({"rss_kib_after_malloc_trim": checkpoints[-1]["rss_kib_after_malloc_trim"]}))
        if heap_report:
            print(heap_report[-1])
    return {"mode": "envoy", "plaintext": plaintext, "concurrency": concurrency, **summary(checkpoints)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("inprocess", "serve", "envoy"), default="inprocess")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--same-body", action="store_true", help="one prompt for all requests: isolates the index")
    parser.add_argument("--plaintext", action="store_true", help="envoy: ext_proc without TLS")
    parser.add_argument("--scraped", action="store_true", help="serve: endpoints with a real /metrics page")
    parser.add_argument("--heap", action="store_true", help="envoy: tracemalloc in epp serve, /debug/heap growth")
    parser.add_argument("--body-kib", type=int, default=0, help="pad every prompt to about this many KiB")
    parser.add_argument("--warmup", type=int, default=2_000, help="envoy: requests before the first checkpoint")
    parser.add_argument("--trim", action="store_true", help="envoy: RSS after malloc_trim(0) at the end (gdb)")
    args = parser.parse_args()
    global SAME_BODY, BODY_KIB, WARMUP
    SAME_BODY, BODY_KIB, WARMUP = args.same_body, args.body_kib, args.warmup
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.mode == "inprocess":
        result = run_inprocess(args.requests, args.every, args.tracemalloc)
    elif args.mode == "serve":
        result = run_serve(args.requests, args.every, args.concurrency, args.scraped)
    else:
        result = run_envoy_mode(args.requests, args.every, args.concurrency, args.plaintext, args.heap, args.trim)
    result.pop("checkpoints")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
