"""What one request costs the picker in-process: the ext_proc state machine from Envoy's bytes to the answers' bytes.

`benchmarks/extproc_overhead.py` measures the picker through a real Envoy, and on a shared 2-CPU machine its
ratios move by ±0.1 from one run to the next. This benchmark isolates the picker's own work per request, so a change
to the hot path can be judged on its own, and side by side with another checkout of the code:

- decode Envoy's two messages (request headers with `protocol_config`, then the whole body, FULL_DUPLEX_STREAMED),
  `StreamProcessor.handle` each (parse; the body's `NeedDecision` through the director's pipeline as the adapter
  runs it, then `resume`: director, scheduling profile, booking), encode every answer, close the stream (release
  the booking, count the request);
- 8 endpoints whose metrics come from real vLLM pages; a scrape lands every 50 requests (20 Hz at 1,000 req/s), so
  the picker's own in-flight picks push endpoints over the saturation thresholds in between, as under load;
- the picker's clock is virtual: 1 ms per request, so data ages as at 1,000 req/s whatever the machine's speed (under
  callgrind a real clock runs ~50× slower than the code, and the metrics would go stale between scrapes);
- the 660-byte chat body of extproc_overhead.py; once with the default profile and once with a random pick (the cost
  of everything but scheduling).

Reported: µs per request (best of 5 batches: the least disturbed by other processes) and, with `--instructions`,
CPU instructions per request counted by valgrind's callgrind inside the measured loop only (1,000 requests
after 300 warm-up ones, the collector settled as `epp serve` settles it; steady to well under 1 %, unlike time on
a shared machine; needs `valgrind`; `--callgrind-out DIR` keeps the files for `callgrind_annotate`). `--root DIR`
measures another checkout of the repository, e.g. a git worktree of an older commit, with this same driver.

    .venv/bin/python -m benchmarks.stream_path [--requests N] [--instructions] [--receipts] [--no-alarms]
        [--front] [--root DIR] [--callgrind-out DIR]

`--receipts` measures each profile a second time with `--emit-route-receipts` (a route receipt read, aggregated and
written into `envoy.lb` metadata for every pick), side by side in the same run; `--no-alarms` once more with the
degradation watch's sample off as well (neither receipts nor alarms: the path without them, in this checkout);
`--front` once more through the native ext_proc front on uvloop (`_front`: HTTP/2 frames in, 10 streams a read,
each stream's task, inbox and idle watch, its answers framed), what a stream costs beyond the state machine.

Bounded: N requests per batch (default 5,000) after 300 warm-up requests; no network.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = 8
SCRAPE_EVERY = 50
TICK_S = 0.001  # virtual seconds per request
PROFILES = {"default": None, "random-pick": "benchmarks/configs/random-picker.yaml"}


def build(
    config_path: str | None, receipts: bool = False, alarms: bool = True, front: bool = False
) -> Callable[[], None]:
    """One request's worth of work as a closure, against a picker wired as `epp serve` wires it; `receipts`:
    with --emit-route-receipts (a route receipt read, aggregated and written into the metadata of every pick);
    not `alarms`: the degradation watch's sample off too (`watch_every=0`), neither receipts nor alarms; `front`:
    through the native ext_proc front (`_front`) instead of the state machine alone."""
    import time

    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from prometheus_client import CollectorRegistry

    from benchmarks.extproc_overhead import BODY

    try:
        from epp.app.config_file import load_config
    except ModuleNotFoundError:  # a checkout from before epp.app.config_file (--root on 3d82d65, say)
        from epp.scheduling.build import load_config  # type: ignore[no-redef]
    from epp.datastore import EndpointTable
    from epp.datastore.objectives import ObjectiveStore
    from epp.director import Director
    from epp.discovery.static import parse_static_endpoints
    from epp.extproc.server import ExternalProcessor
    from epp.extproc.stream import StreamProcessor, StreamSettings
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

    clock = [1000.0]  # virtual seconds, advanced by `one`

    def scrape() -> None:
        for slot, sample in zip(slots, samples, strict=True):
            assert slot is not None
            table.record_scrape(slot, sample, clock[0])

    metrics = PickerMetrics(CollectorRegistry())
    scheduler = build_scheduler(load_config(str(ROOT / config_path)) if config_path else None, seed=1)
    wiring: dict[str, Any] = {}
    try:  # as `epp serve` wires it: the receipts' sink (the degradation watch's sample), receipts emitted or not
        from epp.app.receipt_metrics import ReceiptMetrics

        wiring = {"receipts": ReceiptMetrics(), "emit_receipts": receipts}
        if not alarms:
            wiring["watch_every"] = 0
    except ModuleNotFoundError:  # a checkout from before route receipts
        if receipts:
            raise
    director = Director(
        table,
        scheduler,
        clock=lambda: clock[0],
        observer=metrics,
        objectives=ObjectiveStore(),
        saturation=scheduler.saturation,
        **wiring,
    )
    if wiring:  # an older checkout's sink held one watch
        sink = wiring["receipts"]
        sink.attach(director.watch) if hasattr(sink, "attach") else setattr(sink, "watch", director.watch)
    settings = StreamSettings()
    # Streams come from the server object, which owns what they share (prebuilt answers); an older checkout
    # without `new_stream` built them directly.
    server = ExternalProcessor(director, metrics, settings, time.perf_counter)
    new_stream = getattr(server, "new_stream", None) or (
        lambda: StreamProcessor(director, metrics, time.perf_counter, settings)
    )
    headers = pb.ProcessingRequest()
    for key, value in (
        (":authority", "127.0.0.1:10000"),
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-length", str(len(BODY))),
        ("content-type", "application/json"),
        ("user-agent", "hey/0.0.1"),
        ("accept-encoding", "gzip"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "5d1e5e1c-7a7c-4f7e-9d7e-1f2e3d4c5b6a"),
    ):
        header = headers.request_headers.headers.headers.add()
        header.key = key
        header.raw_value = value.encode()
    headers.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    body = pb.ProcessingRequest()
    body.request_body.body = BODY.encode()
    body.request_body.end_of_stream = True
    wire = (headers.SerializeToString(), body.SerializeToString())
    decode = pb.ProcessingRequest.FromString
    count = 0
    scrape()
    # Where the stream asks for its decision, the adapter calls the pipeline's `immediate` (the director's decide
    # when no stage waits); an older checkout's stream decides itself.
    decide = server.pipeline.immediate if hasattr(server, "pipeline") else None
    if front:
        return _front(director, metrics, settings, wire, clock, scrape)

    def one() -> None:
        nonlocal count
        count += 1
        clock[0] += TICK_S
        if count % SCRAPE_EVERY == 0:
            scrape()
        stream = new_stream()
        for data in wire:
            answers = stream.handle(decode(data))
            if answers.__class__ is not list:  # the stream asks for its decision (NeedDecision): as the adapter does
                try:
                    outcome = decide(answers, stream.subset)
                except Exception as exc:
                    outcome = exc
                answers = stream.resume(outcome, 0.0)
            for answer in answers:
                answer.SerializeToString()
        stream.close()

    return one


FRONT_BATCH = 10  # requests per read of the front's socket (a busy front's read carries ~12 requests' messages)


def _front(
    director: Any,
    metrics: Any,
    settings: Any,
    wire: tuple[bytes, bytes],
    clock: list[float],
    scrape: Callable[[], None],
) -> Callable[[], None]:
    """The same request through the native ext_proc front (epp.extproc.native.server) as `epp serve` runs it on
    uvloop: each stream's HTTP/2 frames (HEADERS, then both messages in one DATA frame that ends the stream) go to
    the connection's `data_received`, `FRONT_BATCH` streams per read; the loop runs until every stream's task has
    answered and ended (its inbox, `Process` with its idle watch, the answers framed and written to a transport
    that drops them). What is counted beyond `one`: the stream's task, its watch, the framing, the loop's turns."""
    import asyncio

    from epp.extproc.bounds import ServerLimits
    from epp.extproc.native import server as native
    from epp.extproc.server import ExternalProcessor
    from tests.extproc.native import frames as f

    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ModuleNotFoundError:
        loop = asyncio.new_event_loop()
    processor = ExternalProcessor(director, metrics, settings, limits=ServerLimits(close_grace_s=0.0))
    front = native.NativeServer(processor, "127.0.0.1", 0)  # bound, never listening: the connection is fed here

    written = [0]  # bytes the front wrote since the last read: at least the DATA it sent, granted back as Envoy would

    class _Drop(asyncio.Transport):
        def write(self, data: Any) -> None:
            written[0] += len(data)

        def close(self) -> None:
            pass

        def abort(self) -> None:
            pass

    async def connect() -> Any:
        conn = native._Connection(front)
        conn.connection_made(_Drop())
        conn.data_received(f.handshake())
        return conn

    conn = loop.run_until_complete(connect())
    body = b"".join(f.grpc_message(raw) for raw in wire)
    block = f.request_block()
    sid = [1]
    pending: list[bytes] = []

    def stream_bytes() -> bytes:
        n = sid[0]
        sid[0] += 2
        return f.frame(f.HEADERS, f.END_HEADERS, n, block) + f.frame(f.DATA, f.END_STREAM, n, body)

    async def served(data: bytes) -> None:
        conn.data_received(data)
        while conn._streams:  # every stream's task answered and ended
            await asyncio.sleep(0)

    count = 0

    def one() -> None:
        nonlocal count
        count += 1
        clock[0] += TICK_S
        if count % SCRAPE_EVERY == 0:
            scrape()
        pending.append(stream_bytes())
        if len(pending) == FRONT_BATCH:
            data = (f.window_update(0, written[0]) if written[0] else b"") + b"".join(pending)  # its window reopened
            pending.clear()
            written[0] = 0
            loop.run_until_complete(served(data))

    return one


def _settle_gc() -> None:
    """The collector as `epp serve` leaves it after start-up (epp.app.runtime.settle_garbage_collector, the same
    numbers in 3d82d65): start-up objects frozen, the young generation collected every 50,000 allocations. With the
    default thresholds a full collection re-walks every module's objects at a point that differs between the runs
    a count subtracts, and moved one checkout's figure by up to ±25k instructions per request."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _label(profile: str, receipts: bool, alarms: bool, front: bool = False) -> str:
    return (
        profile
        + (", receipts on" if receipts else "")
        + ("" if alarms else ", receipts and alarms off")
        + (", through the native front" if front else "")
    )


def _child(profile: str, requests: int, receipts: bool = False, alarms: bool = True, front: bool = False) -> None:
    """Run as a child (timing or under valgrind): warm up, then `requests` requests; print µs per request."""
    one = build(PROFILES[profile], receipts, alarms, front)
    _settle_gc()
    for _ in range(300):
        one()
    if requests:
        best = min(timeit.repeat(one, number=requests, repeat=5)) / requests
        print(json.dumps({"profile": _label(profile, receipts, alarms, front), "us": best * 1e6}))


def _child_argv(profile: str, requests: int, *extra: str) -> list[str]:
    # This file by path, so that an older checkout (--root) without it is measured by the same driver.
    return [sys.executable, str(Path(__file__).resolve()), "--child", profile, str(requests), *extra]


def _child_env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}


def _run_child(root: Path, profile: str, requests: int, *extra: str) -> str:
    argv = _child_argv(profile, requests, *extra)
    return subprocess.run(argv, cwd=root, env=_child_env(root), capture_output=True, text=True, check=True).stdout


def _measured(one: Callable[[], None], requests: int) -> None:
    """`requests` requests inside one `functools.reduce` call: the C function callgrind toggles collection on, so
    only the measured requests are counted (not start-up, warm-up or exit, whose totals moved by millions of
    instructions between two runs of the same code when the count was a difference of two whole runs)."""
    functools.reduce(lambda _, __: one(), range(requests + 1))


def _instructions(root: Path, profile: str, requests: int, out_dir: Path | None = None, *extra: str) -> float:
    """Instructions per request, counted by callgrind inside the measured loop only (`_measured`). With `out_dir`
    callgrind's file is kept there (`callgrind_annotate --inclusive=yes FILE`: the cost per C function)."""
    name = profile + "".join(extra).replace("--", "-")
    out_file = "/dev/null" if out_dir is None else str(out_dir.resolve() / f"callgrind.{name}.out")
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        f"--callgrind-out-file={out_file}",
        *_child_argv(profile, requests, "--count", *extra),
    ]
    out = subprocess.run(
        argv, cwd=root, env=_child_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True
    )
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise RuntimeError("callgrind printed no total")
    return int(match.group(1)) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000, help="requests per timed batch")
    parser.add_argument("--instructions", action="store_true", help="also count instructions with callgrind")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    parser.add_argument("--callgrind-out", type=Path, help="with --instructions: keep callgrind's files in this folder")
    parser.add_argument("--child", nargs=2, metavar=("PROFILE", "N"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--receipts", action="store_true", help="also measure each profile with --emit-route-receipts, side by side"
    )
    parser.add_argument(
        "--no-alarms",
        action="store_true",
        help="also measure each profile with the degradation watch off too (neither receipts nor alarms: what the "
        "path costs without them, in this checkout), side by side",
    )
    parser.add_argument(
        "--front",
        action="store_true",
        help="also measure each profile through the native ext_proc front (its HTTP/2 framing, each stream's task, "
        "inbox and idle watch, on uvloop), side by side",
    )
    parser.add_argument("--no-watch", action="store_true", help=argparse.SUPPRESS)  # a child: the watch off
    parser.add_argument("--via-front", action="store_true", help=argparse.SUPPRESS)  # a child: through the front
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        profile, n = args.child[0], int(args.child[1])
        if args.count:
            one = build(PROFILES[profile], args.receipts, not args.no_watch, args.via_front)
            _settle_gc()
            for _ in range(300):
                one()
            _measured(one, n)
        else:
            _child(profile, n, args.receipts, not args.no_watch, args.via_front)
        return
    if args.instructions and shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (Debian package `valgrind`)")
    rows: list[dict[str, Any]] = []
    extras: list[tuple[str, ...]] = [()]
    extras += [("--no-watch",)] if args.no_alarms else []
    extras += [("--receipts",)] if args.receipts else []
    extras += [("--via-front",)] if args.front else []
    variants = [(profile, extra) for profile in PROFILES for extra in extras]
    for profile, extra in variants:
        row: dict[str, Any] = json.loads(_run_child(args.root, profile, args.requests, *extra))
        if args.instructions:
            row["instructions"] = _instructions(args.root, profile, 1000, args.callgrind_out, *extra)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nroot: {args.root}\n\n| profile | µs per request (best of 5) | instructions per request |\n|---|---|---|")
    for row in rows:
        count = f"{row['instructions']:,.0f}" if "instructions" in row else "–"
        print(f"| {row['profile']} | {row['us']:.1f} | {count} |")


if __name__ == "__main__":
    main()
