"""Scraper costs, side by side in one run (issue 3).

1. Parser: µs per page, ours vs `prometheus_client.parser`, on a whole vLLM page (tests/scrape/vllm_page.py),
   measured interleaved, best of several rounds each.
2. Scrape throughput: N loopback endpoints (one child process serving N ports with that page), the scrape service
   polling as fast as it can for a few seconds: pages/s and CPU µs per page (this process's CPU time / pages).
3. Data age: 256 endpoints at a 100 ms interval: p50/p99 of (now − scraped_at), sampled every 10 ms.
4. The gRPC picker: `epp serve` pinned to one CPU, driven by h2load (C, on the other CPU) with ext_proc streams
   (headers + buffered body, then half-close), with scraping of 256 endpoints at 100 ms and without (interval 1 h),
   alternated; the drop in streams/s is the figure.

Run (2 CPUs at least; h2load from the Debian package nghttp2-client):
    .venv/bin/python -m benchmarks.scrape [--seconds 5] [--counts 64,256,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.engines import BUILTIN_ENGINES, extract
from epp.scrape.process import ScrapeProcess
from epp.scrape.scraper import ScrapeService, ScrapeSettings
from tests.scrape.vllm_page import vllm_page

ROOT = Path(__file__).resolve().parents[1]
PAGE = vllm_page()


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- 1. parser -------------------------------------------------------------------------------------------------


def bench_parser(rounds: int = 5) -> dict[str, float]:
    """Cold: the parser's line cache emptied before every page (a page never seen); warm: the same page again
    (what repeated scrapes of an idle server look like). The ≥ 50× target is judged on cold."""
    engine = BUILTIN_ENGINES["vllm"]
    parser = engine.parser

    def cold() -> None:
        parser._cache.clear()
        parser.parse(PAGE)

    def cold_extract() -> None:
        parser._cache.clear()
        extract(PAGE, engine)

    def best(fn: object, number: int) -> float:
        return min(timeit.repeat(fn, number=number, repeat=3)) / number * 1e6  # type: ignore[arg-type]

    ours, warm, extract_us, ref = [], [], [], []
    for _ in range(rounds):
        ours.append(best(cold, 200))
        warm.append(best(lambda: parser.parse(PAGE), 200))
        extract_us.append(best(cold_extract, 200))
        ref.append(best(lambda: list(text_string_to_metric_families(PAGE)), 5))
    return {
        "page_lines": PAGE.count("\n"),
        "page_bytes": len(PAGE),
        "ours_cold_us": min(ours),
        "ours_warm_us": min(warm),
        "extract_cold_us": min(extract_us),
        "prometheus_client_us": min(ref),
        "ratio_cold": min(ref) / min(ours),
        "ratio_warm": min(ref) / min(warm),
    }


# -- page servers (child process) ----------------------------------------------------------------------------


async def _serve_pages(count: int) -> None:
    body = PAGE.encode()
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )

    class Page(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                _, self.buf = self.buf.split(b"\r\n\r\n", 1)
                self.transport.write(response)  # type: ignore[attr-defined]

    loop = asyncio.get_running_loop()
    ports = []
    for _ in range(count):
        server = await loop.create_server(Page, "127.0.0.1", 0, backlog=64)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.sleep(3600)


class PageServers:
    """N loopback ports serving the page, from one child process (optionally pinned to CPUs)."""

    def __init__(self, count: int, cpus: str | None = None) -> None:
        argv = [sys.executable, "-m", "benchmarks.scrape", "--serve-pages", str(count)]
        if cpus and shutil.which("taskset"):
            argv = ["taskset", "-c", cpus, *argv]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.ports: list[int] = json.loads(self.proc.stdout.readline())
        self.addresses = [f"127.0.0.1:{p}" for p in self.ports]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- 2./3. scrape throughput and data age --------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _scrape_run(
    addresses: list[str], settings: ScrapeSettings, seconds: float, child: bool = False
) -> dict[str, float]:
    table = EndpointTable()
    for a in addresses:
        table.upsert(EndpointInfo(a))
    svc: ScrapeService | ScrapeProcess = (
        ScrapeProcess(table, settings) if child else ScrapeService(table, settings, seed=7)
    )
    await svc.start()
    if child:
        await asyncio.sleep(2.0)  # the child imports numpy, connects
    await asyncio.sleep(min(1.0, settings.interval_s * 5) + 0.2)  # connect, first round
    start_pages = sum(s.scrapes for s in svc.status().values())
    child_pid = svc.pid if isinstance(svc, ScrapeProcess) else None
    child0 = _proc_cpu_s(child_pid) if child_pid else 0.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ages: list[float] = []
    end = wall0 + seconds
    while time.perf_counter() < end:
        await asyncio.sleep(0.01)
        now = time.monotonic()
        scraped = table.column("scraped_at")
        ages.extend((now - scraped[table.column("present")]).tolist())
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    child_cpu = _proc_cpu_s(child_pid) - child0 if child_pid else 0.0
    if child:
        await asyncio.sleep(1.2)  # the child reports statuses once a second
    status = svc.status().values()
    pages = sum(s.scrapes for s in status) - start_pages
    failures = sum(s.failures for s in status)
    await svc.stop()
    ages.sort()
    return {
        "endpoints": len(addresses),
        "pages_per_s": pages / wall,
        "cpu_us_per_page": (cpu + child_cpu) / max(pages, 1) * 1e6,
        "picker_process_cpu_share": cpu / wall,
        "scrape_child_cpu_share": child_cpu / wall,
        "failures": failures,
        "age_p50_ms": ages[len(ages) // 2] * 1e3,
        "age_p99_ms": ages[int(len(ages) * 0.99)] * 1e3,
    }


def bench_scrape(counts: list[int], seconds: float) -> list[dict[str, float]]:
    results = []
    for n in counts:
        servers = PageServers(n, cpus="1")
        try:
            flat_out = ScrapeSettings(interval_s=0.001, timeout_s=5.0, jitter=0.0, concurrency=1024)
            results.append({"mode": "max rate", **asyncio.run(_scrape_run(servers.addresses, flat_out, seconds))})
        finally:
            servers.stop()
    return results


def bench_age(seconds: float) -> list[dict[str, float]]:
    servers = PageServers(256, cpus="1")
    out = []
    try:
        for child in (False, True):
            run = _scrape_run(servers.addresses, ScrapeSettings(interval_s=0.1), seconds, child)
            out.append({"mode": "100 ms, " + ("child process" if child else "in process"), **asyncio.run(run)})
    finally:
        servers.stop()
    return out


# -- 4. the gRPC picker with and without scraping ------------------------------------------------------------


def _grpc_body() -> bytes:
    """Two ext_proc messages, gRPC-framed: request headers (buffered body mode), then the whole body."""
    from envoy.config.core.v3 import base_pb2
    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Say hello. " * 60}]}).encode()
    headers = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
        ]
    )
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=headers, end_of_stream=False),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=processing_mode_pb2.ProcessingMode.BUFFERED),
    )
    second = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
    out = b""
    for msg in (first, second):
        data = msg.SerializeToString()
        out += struct.pack(">BI", 0, len(data)) + data
    return out


def _check_one_stream(port: int) -> str:
    """One real stream through the grpc client: the picker must answer with a destination."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    body = _grpc_body()
    msgs = []
    pos = 0
    while pos < len(body):
        (length,) = struct.unpack(">I", body[pos + 1 : pos + 5])
        msgs.append(pb.ProcessingRequest.FromString(body[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        answers = list(stub.Process(iter(msgs), timeout=10))
    return str(answers[-1]).replace("\n", " ")[:300]


def _h2load(port: int, body_file: Path, seconds: float, cpus: str) -> dict[str, float]:
    argv = [
        "h2load", "-c", "8", "-m", "16", "-t", "1", "-D", str(int(seconds)), "-d", str(body_file),
        "-H", "content-type: application/grpc", "-H", "te: trailers",
        f"http://127.0.0.1:{port}/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    ]  # fmt: skip
    if shutil.which("taskset"):
        argv = ["taskset", "-c", cpus, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rps = float(out.split("finished in")[1].split(",")[1].split("req/s")[0])
    succeeded = int(out.split("requests:")[1].split("succeeded,")[0].split(",")[-1].strip().split()[0])
    return {"streams_per_s": rps, "succeeded": succeeded}


def bench_picker(seconds: float, rounds: int) -> dict[str, object]:
    from tests.support.procs import free_port, port_open, stop, wait_until

    if not shutil.which("h2load"):
        return {"skipped": "h2load not installed"}
    servers = PageServers(256, cpus="1")
    tmp = Path(tempfile.mkdtemp(prefix="epp-scrape-bench-"))
    body_file = tmp / "body.bin"
    body_file.write_bytes(_grpc_body())
    modes = {
        "off": ["--refresh-metrics-interval", "3600s", "--metrics-scrape-in-process"],
        "in_process": ["--refresh-metrics-interval", "100ms", "--metrics-scrape-in-process"],
        "child_process": ["--refresh-metrics-interval", "100ms"],
    }
    runs: dict[str, list[float]] = {m: [] for m in modes}
    sample = ""
    try:
        for _ in range(rounds):
            for mode, flags in modes.items():
                grpc_port = free_port()
                argv = [
                    sys.executable, "-m", "epp", "serve", "--static-endpoints", ",".join(servers.addresses),
                    "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
                    "--metrics-port", str(free_port()), "--bind-address", "127.0.0.1", "-v", "0", *flags,
                    "--secure-serving=false",  # h2load speaks plaintext h2c; this measures scraping, not TLS
                    "--workers", "1",  # one serving process: its CPU and threads are what this measures
                ]  # fmt: skip
                pinned = shutil.which("taskset") is not None
                if pinned:
                    argv = ["taskset", "-c", "0", *argv]
                with (tmp / f"epp-{mode}.log").open("wb") as log:
                    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
                try:
                    wait_until(lambda p=grpc_port: port_open(p), 60, "epp serve", proc)  # type: ignore[misc]
                    time.sleep(2.0)  # connections up, first scrape rounds done
                    if pinned:  # the scrape child inherits CPU 0: move it to the other CPU, as a pod would give it
                        for child in _children(proc.pid):
                            subprocess.run(["taskset", "-p", "-c", "1", str(child)], capture_output=True, check=False)
                    if not sample:
                        sample = _check_one_stream(grpc_port)
                    runs[mode].append(_h2load(grpc_port, body_file, seconds, "1")["streams_per_s"])
                finally:
                    stop(proc)
    finally:
        servers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    best = {m: max(v) for m, v in runs.items()}
    return {
        "streams_per_s": runs,
        "best": best,
        "drop_in_process": 1 - best["in_process"] / best["off"],
        "drop_child_process": 1 - best["child_process"] / best["off"],
        "median_drop_child_process": 1 - statistics.median(runs["child_process"]) / statistics.median(runs["off"]),
        "sample_answer": sample,
    }


def _children(pid: int) -> list[int]:
    """Descendants of pid (the scrape child sits under `epp serve`, which may sit under taskset's exec)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--counts", default="64,256,1024")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the picker run")
    ap.add_argument("--only", default="parser,scrape,age,picker")
    ap.add_argument("--serve-pages", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    _raise_fd_limit()
    if args.serve_pages:
        asyncio.run(_serve_pages(args.serve_pages))
        return
    only = set(args.only.split(","))
    print(f"# benchmarks/scrape.py on {os.cpu_count()} CPUs, python {sys.version.split()[0]}", flush=True)
    if "parser" in only:
        print("parser:", json.dumps(bench_parser()), flush=True)
    if "scrape" in only:
        for r in bench_scrape([int(c) for c in args.counts.split(",")], args.seconds):
            print("scrape:", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}))
    if "age" in only:
        for r in bench_age(args.seconds):
            print("age:", json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    if "picker" in only:
        print("picker:", json.dumps(bench_picker(args.seconds, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
