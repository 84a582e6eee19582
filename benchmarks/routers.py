"""The routing layer side by side: Envoy + the picker, Envoy + a no-op ext_proc, and two Rust routers.

Every router gets the same two backends, the same chat body and the same load generator (`wrk`, keep-alive),
round after round (interleaved, medians). For each: req/s, p50/p99, and CPU per request from /proc of every
process the router is made of (the picker: its control process, serving workers and scrape child, found as the
descendants of the process started; Envoy apart, in its own column, because a standalone router has no Envoy):
  - `envoy+noop`:   Envoy with an ext_proc filter to benchmarks/noop_extproc.py (Python, grpc.aio, no decision);
  - `envoy+epp-wN`: Envoy with the ext_proc filter to `epp serve --workers N` (default profile, TLS, scraping);
  - `smg`:          the SGLang / Shepherd Model Gateway (`smg launch --policy cache_aware`, PyPI `smg`);
  - `vllm-router`:  vLLM's router (`vllm-router --policy cache_aware`, PyPI `vllm-router`).
The backends are one separate Envoy of direct-response listeners (a canned completion, a vLLM `/metrics` page
for the picker's scraper), so they never limit the run and their CPU is nobody's. Neither Rust router is a
dependency of this project: install each in its own venv and pass its binary, e.g.

    python3 -m venv /tmp/smg-venv && /tmp/smg-venv/bin/pip install smg==1.13.0
    python3 -m venv /tmp/vllmr-venv && /tmp/vllmr-venv/bin/pip install vllm-router==0.1.17
    .venv/bin/python -m benchmarks.routers --smg /tmp/smg-venv/bin/smg --vllm-router /tmp/vllmr-venv/bin/vllm-router \\
        --concurrency 16,64 --seconds 8 --rounds 3 [--workers 1,2] [--epp-args '--extproc-transport native']

Needs `wrk` (Debian package `wrk`). Benchmarks are not run by CI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.extproc_overhead import MODES, _backend_listener, _cpu_seconds, _load_1m
from epp.cli.flag_types import positive_duration
from epp.gateway.options import GatewayOptions
from epp.gateway.testbed import bootstrap, ext_proc_filter, listener, pool_cluster, static_cluster
from tests.scrape.vllm_page import vllm_page
from tests.support.envoy import run_envoy
from tests.support.procs import free_port, http_ok, port_open, running, serve_argv, wait_until

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Streams per ext_proc connection as `epp envoy-config` renders them (--epp-streams-per-connection's default).
ENVOY_CONFIG_STREAMS = next(
    f.default for f in dataclasses.fields(GatewayOptions) if f.name == "epp_streams_per_connection"
)
BACKENDS = 2
# A 752-byte OpenAI chat body (as in the measurement): one user message.
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 680}], "max_tokens": 16})
ANSWER = json.dumps(
    {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 170, "completion_tokens": 1, "total_tokens": 171},
    }
)
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sim"}]})
WRK_LUA = (
    'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = io.open("{body}"):read("*a")\n'
)


def descendants(pid: int) -> list[int]:
    """pid and every process below it (the picker's workers and scrape child, a router's threads' owner)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def wrk(url: str, seconds: float, concurrency: int, script: Path) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t", "2", "-c", str(concurrency), "-d", f"{max(1, round(seconds))}s", "--latency", "-s", str(script),
         url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    total = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if total is None or rps is None:
        raise RuntimeError(f"{url}: wrk printed no totals:\n{out[-1500:]}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)

    def quantile(q: str) -> float:
        m = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        if m is None:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    return {
        "requests": float(total.group(1)),
        "rps": float(rps.group(1)),
        "p50_ms": quantile("50"),
        "p99_ms": quantile("99"),
        "bad": float(non2xx.group(1) if non2xx else 0) + float(sum(map(int, errors.groups())) if errors else 0),
    }


def _backend_config(ports: list[int]) -> dict[str, Any]:
    listeners = []
    for i, port in enumerate(ports):
        config = _backend_listener(f"backend{i}", port, ANSWER, vllm_page(waiting=0, running=2 + i))
        routes = config["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        routes.insert(
            0,
            {"match": {"prefix": "/v1/models"}, "direct_response": {"status": 200, "body": {"inline_string": MODELS}}},
        )
        listeners.append(config)
    return bootstrap(listeners, [], free_port())


@contextlib.contextmanager
def _standalone(name: str, argv: list[str], port: int, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    with running(argv, tmp / f"{name}.log") as proc:
        try:
            wait_until(lambda: port_open(port), 60, name, proc)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; its log ends:\n{(tmp / f'{name}.log').read_text()[-2000:]}") from None
        yield proc


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if shutil.which("wrk") is None:
        sys.exit("needs `wrk` (apt-get install wrk)")
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    streams = args.streams_per_connection
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="epp-routers-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        (tmp / "body.json").write_text(BODY)
        script = tmp / "post.lua"
        script.write_text(WRK_LUA.format(body=tmp / "body.json"))
        backends = [free_port() for _ in range(BACKENDS)]
        stack.enter_context(run_envoy(tmp, _backend_config(backends), "backends", 1))
        urls = [f"http://127.0.0.1:{p}" for p in backends]
        targets: dict[str, tuple[int, list[int], bool]] = {}  # name → (port, pids of the router, behind Envoy?)

        noop_port = free_port()
        noop = stack.enter_context(
            running([sys.executable, "-m", "benchmarks.noop_extproc", str(noop_port)], tmp / "noop.log")
        )
        wait_until(lambda: port_open(noop_port), 20, "noop ext_proc", noop)
        pickers: dict[int, tuple[int, int, subprocess.Popen[bytes]]] = {}
        for w in workers:
            grpc_port, metrics_port = free_port(), free_port()
            argv = serve_argv(grpc_port, free_port(), metrics_port, "--static-endpoints",
                              ",".join(u.removeprefix("http://") for u in urls), "-v", "0", "--workers", str(w),
                              *args.epp_args.split())  # fmt: skip
            proc = stack.enter_context(running(argv, tmp / f"epp-w{w}.log"))
            wait_until(lambda m=metrics_port: http_ok(f"http://127.0.0.1:{m}/readyz"), 60, f"epp -w{w}", proc)
            pickers[w] = (grpc_port, metrics_port, proc)
        mode = MODES["request"]
        to_pool = {"route": {"cluster": "pool", "timeout": "10s"}}
        to_first = {"route": {"cluster": "backend", "timeout": "10s"}}
        envoy_ports = {"envoy+noop": free_port(), **{f"envoy+epp-w{w}": free_port() for w in workers}}
        config = bootstrap(
            [
                listener("envoy+noop", envoy_ports["envoy+noop"], to_first, [ext_proc_filter("noop", mode)]),
                *(
                    listener(f"epp-w{w}", envoy_ports[f"envoy+epp-w{w}"], to_pool, [ext_proc_filter(f"epp-w{w}", mode)])
                    for w in workers
                ),
            ],
            [
                static_cluster("backend", backends[0]),
                pool_cluster(),
                static_cluster("noop", noop_port, http2=True, tls=True, streams_per_connection=streams),
                *(
                    static_cluster(f"epp-w{w}", pickers[w][0], http2=True, tls=True, streams_per_connection=streams)
                    for w in workers
                ),
            ],
            free_port(),
        )
        admin = stack.enter_context(run_envoy(tmp, config, "front", args.envoy_concurrency))
        envoy_pid = _pid_listening(admin)
        targets["envoy+noop"] = (envoy_ports["envoy+noop"], [noop.pid], True)
        clusters = {"envoy+noop": "noop"}
        for w in workers:
            targets[f"envoy+epp-w{w}"] = (envoy_ports[f"envoy+epp-w{w}"], [pickers[w][2].pid], True)
            clusters[f"envoy+epp-w{w}"] = f"epp-w{w}"
        if args.smg:
            port = free_port()
            argv = [args.smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
                    "--worker-urls", *urls, "--log-level", "warn", "--prometheus-port", str(free_port())]  # fmt: skip
            targets["smg"] = (port, [stack.enter_context(_standalone("smg", argv, port, tmp)).pid], False)
        if args.vllm_router:
            port = free_port()
            argv = [args.vllm_router, "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
                    "--worker-urls", *urls, "--prometheus-port", str(free_port())]  # fmt: skip
            targets["vllm-router"] = (
                port,
                [stack.enter_context(_standalone("vllm-router", argv, port, tmp)).pid],
                False,
            )
        for c in concurrencies:
            for port, _, _ in targets.values():
                wrk(f"http://127.0.0.1:{port}/v1/chat/completions", 2, c, script)  # warm-up, and a check it serves
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            split_of = {f"envoy+epp-w{w}": _Split(pickers[w][2].pid, pickers[w][1]) for w in workers}
            loads = []
            for _ in range(args.rounds):
                for name, (port, roots, behind_envoy) in targets.items():
                    pids = [p for r in roots for p in descendants(r)]
                    if name in split_of:
                        split_of[name].before(pids)
                    cpu_before_by_pid = _cpu_by_pid(pids)
                    cpu_before = sum(cpu_before_by_pid.values())
                    envoy_before = _cpu_seconds([envoy_pid]) if behind_envoy else 0.0
                    tls_before = _tls_counts(admin, clusters.get(name))
                    loads.append(_load_1m())
                    result: dict[str, Any] = dict(
                        wrk(f"http://127.0.0.1:{port}/v1/chat/completions", args.seconds, c, script)
                    )
                    tls_after = _tls_counts(admin, clusters.get(name))
                    result["handshakes"] = tls_after[0] - tls_before[0]
                    result["resumed"] = tls_after[1] - tls_before[1]
                    n = max(1.0, result["requests"])
                    result["router_us"] = 1e6 * (_cpu_seconds(pids) - cpu_before) / n
                    result["envoy_us"] = (
                        1e6 * (_cpu_seconds([envoy_pid]) - envoy_before) / n if behind_envoy else float("nan")
                    )
                    if name in split_of:
                        result["split"] = split_of[name].after(cpu_before_by_pid, n)
                    runs[name].append(result)
            row: dict[str, Any] = {"concurrency": c, "load_1m": [min(loads), max(loads)], "cores": os.cpu_count()}
            for name, rs in runs.items():
                row[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "split"}
                if "split" in rs[0]:
                    row[name]["split"] = {
                        k: statistics.median(r["split"].get(k, 0.0) for r in rs) for k in rs[0]["split"]
                    }
                row[name]["rps_all"] = [round(r["rps"]) for r in rs]
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def _cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """utime + stime of each of these processes, in seconds (a process gone is left out)."""
    return {pid: _cpu_seconds([pid]) for pid in pids if Path(f"/proc/{pid}").exists()}


def _switches(pid: int) -> tuple[int, int, int]:
    """Counts of the process so far, from /proc, that hold under load where its µs do not: its threads' voluntary
    context switches (slept, then woken), their involuntary ones (preempted while runnable), and its read-like
    system calls (`syscr`: each read of a socket). A thread gone is left out; 0s if the process is."""
    voluntary = preempted = reads = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        preempted += int(line.split()[1])
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscr:"):
                reads = int(line.split()[1])
    return voluntary, preempted, reads


def _role(root: int, pid: int) -> str:
    """What a process of the picker is, from its command line: the root (`control`; with `--workers 1` the one
    serving process), a serving worker, the scrape child, the KV-events feeder."""
    if pid == root:
        return "control"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "other"
    module = argv[argv.index(b"epp.supervision.launch") + 1].decode() if b"epp.supervision.launch" in argv else ""
    return {"epp.app.worker": "worker", "epp.scrape.child": "scrape", "epp.app.kv_feeder": "feeder"}.get(
        module, "other"
    )


class _Split:
    """One picker's CPU per request by process (control, each worker, scrape child) and each worker's share of the
    streams, over one run: the workers' streams from /debug/pool (read outside the measured window: reading it asks
    every worker to render its metrics)."""

    def __init__(self, root: int, metrics_port: int) -> None:
        self._root = root
        self._url = f"http://127.0.0.1:{metrics_port}/debug/pool"
        self._streams: dict[int, int] = {}
        self._switches: dict[int, tuple[int, int, int]] = {}

    def _workers(self) -> dict[int, tuple[int, int]]:
        """pid → (worker index, streams so far)."""
        with urllib.request.urlopen(self._url) as r:
            report = json.loads(r.read())
        return {int(w["pid"]): (int(w["worker"]), int(w["streams"])) for w in report.get("workers", [])}

    def before(self, pids: list[int]) -> None:
        self._streams = {pid: streams for pid, (_, streams) in self._workers().items()}
        self._switches = {pid: _switches(pid) for pid in pids}

    def after(self, cpu_before: dict[int, float], requests: float) -> dict[str, float]:
        """µs of CPU per request (of all the run's requests) by process, and each worker's share of the streams:
        `control`, `scrape`, `worker0_us` / `worker0_streams` (share of the streams, 0–1), …, ordered by index;
        `wakeups`: the picker's processes' voluntary context switches per request, all of them together; the serving
        processes' (the workers', or the one process's) `preempted` (involuntary switches) and `reads` (read-like
        system calls) per request they served, summed over them: with workers, what each pays per own request."""
        cpu_after = _cpu_by_pid(list(cpu_before))
        workers = self._workers()
        streams = {pid: workers[pid][1] - self._streams.get(pid, 0) for pid in workers}
        total_streams = max(1, sum(streams.values()))
        moved = {
            pid: [a - b for a, b in zip(_switches(pid), before, strict=True)] for pid, before in self._switches.items()
        }
        serving = [pid for pid in moved if pid in workers] or [self._root]
        out: dict[str, float] = {
            "wakeups": sum(m[0] for m in moved.values()) / requests,
            "preempted": sum(moved[pid][1] for pid in serving if pid in moved) / requests,
            "reads": sum(moved[pid][2] for pid in serving if pid in moved) / requests,
        }
        for pid, before in cpu_before.items():
            us = 1e6 * (cpu_after.get(pid, before) - before) / requests
            if pid in workers:
                out[f"worker{workers[pid][0]}_us"] = us
                out[f"worker{workers[pid][0]}_streams"] = streams[pid] / total_streams
            else:
                role = _role(self._root, pid)
                out[role] = out.get(role, 0.0) + us
        return dict(sorted(out.items()))


def _tls_counts(admin_port: int, cluster: str | None) -> tuple[float, float]:
    """Envoy's TLS handshakes to an ext_proc cluster so far, and how many of them resumed a session."""
    if cluster is None:
        return float("nan"), float("nan")
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=^cluster\\.{cluster}\\.ssl\\.") as r:
        stats = dict(line.split(": ", 1) for line in r.read().decode().splitlines() if ": " in line)
    return float(stats.get(f"cluster.{cluster}.ssl.handshake", 0)), float(
        stats.get(f"cluster.{cluster}.ssl.session_reused", 0)
    )


def _pid_listening(admin_port: int) -> int:
    """The Envoy process that owns this admin port (its /server_info does not say; /proc/net/tcp and fds do)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == admin_port and fields[3] == "0A":
            inode = fields[9]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return int(entry.name)
    raise RuntimeError(f"no process listens on admin port {admin_port}")


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| c | router | req/s (rounds) | p50 / p99 ms | router CPU µs/request | Envoy's µs/request | non-2xx+errors "
        "| TLS handshakes (resumed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        for name, r in row.items():
            if not isinstance(r, dict):
                continue
            envoy = "—" if r["envoy_us"] != r["envoy_us"] else f"{r['envoy_us']:,.0f}"
            tls = "—" if r["handshakes"] != r["handshakes"] else f"{r['handshakes']:.0f} ({r['resumed']:.0f})"
            lines.append(
                f"| {row['concurrency']} | {name} | {r['rps']:,.0f} ({' '.join(map(str, r['rps_all']))}) | "
                f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} | {r['router_us']:,.0f} | {envoy} | {r['bad']:.0f} | {tls} |"
            )
    lines += ["", split_table(results)]
    for row in results:
        lines.append(
            f"\nc={row['concurrency']}: 1-min load average {row['load_1m'][0]:.1f}-{row['load_1m'][1]:.1f} "
            f"on {row['cores']} cores"
        )
    return "\n".join(lines)


def split_table(results: list[dict[str, Any]]) -> str:
    """The pickers' CPU per request by process (medians over the rounds), each worker's share of the streams."""
    lines = [
        "| c | router | control µs/request | scrape child | each worker µs/request (share of streams) | other "
        "| wakeups/request | serving: preempted/request, reads/request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        for name, r in row.items():
            if not isinstance(r, dict) or "split" not in r:
                continue
            split = r["split"]
            workers = sorted({k.split("_")[0] for k in split if k.startswith("worker")})
            each = " · ".join(f"{split[f'{w}_us']:,.0f} ({split[f'{w}_streams']:.0%})" for w in workers) or "—"
            lines.append(
                f"| {row['concurrency']} | {name} | {split.get('control', 0.0):,.0f} | {split.get('scrape', 0.0):,.0f}"
                f" | {each} | {split.get('other', 0.0) + split.get('feeder', 0.0):,.0f} | {split['wakeups']:.2f}"
                f" | {split.get('preempted', float('nan')):.2f}, {split.get('reads', float('nan')):.3f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=positive_duration, default=8, help="length of one load run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--workers", default="1,2", help="epp serve --workers counts, e.g. 1,2")
    parser.add_argument("--epp-args", default="", help="extra `epp serve` flags")
    parser.add_argument("--envoy-concurrency", type=int, default=2, help="the front Envoy's worker threads")
    parser.add_argument(
        "--streams-per-connection",
        type=int,
        default=ENVOY_CONFIG_STREAMS,
        help="ext_proc streams per Envoy connection before a new one (default: what `epp envoy-config` renders)",
    )
    parser.add_argument("--smg", help="the `smg` binary (its own venv)")
    parser.add_argument("--vllm-router", help="the `vllm-router` binary (its own venv)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = run(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
