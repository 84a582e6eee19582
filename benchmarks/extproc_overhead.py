"""What the picker costs per request through a real Envoy, against the price of ext_proc itself.

Side by side in one run, the same Envoy, backend and load generator:
  (a) Envoy → backend, no ext_proc;
  (b) Envoy + a no-op Python ext_proc server (benchmarks/noop_extproc.py) with the same processing modes;
  (c) Envoy + `epp serve` (parse, decide, route by its metadata).
The ratio (c)/(b) is the figure of merit: (b) is what any Python ext_proc server pays; the rest is ours.
With `--workers 1,2,4` (c) runs once per count (`epp serve --workers W`, column `epp-wW`), each with the picker's
processes' CPU time per request (control process + workers, from /proc): on a machine whose cores Envoy and the
load generator share, req/s cannot show the scaling, but CPU-ms per request × cores bounds it. With
`--transports grpc,native` each count runs once per ext_proc transport (`--extproc-transport`; columns
`epp-grpc-wW`, `epp-native-wW`). The no-op server's CPU and Envoy's are measured the same way, per request.
The pool is 8 Envoy direct-response listeners, each also serving a realistic vLLM `/metrics` page, so the
picker scrapes, scores and picks as in production, and the backends never limit the run.

Needs `hey` (Debian package `hey`). Run:
    .venv/bin/python -m benchmarks.extproc_overhead [--seconds 10] [--rounds 3] [--concurrency 16,64]
        [--modes request,full] [--epp-args '--config-file FILE'] [--workers 1,2] [--envoy-concurrency 2]
        [--transports grpc,native]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from epp.cli.flag_types import positive_duration
from epp.gateway.testbed import (
    bootstrap,
    ext_proc_filter,
    listener,
    pool_cluster,
    processing_mode,
    static_cluster,
)
from tests.scrape.vllm_page import vllm_page
from tests.support.envoy import run_envoy
from tests.support.procs import free_port, http_ok, port_open, running, serve_argv, wait_until

BODY = json.dumps(
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "Say hello. " * 60}]}
)
ANSWER = json.dumps({"id": "x", "choices": [{"message": {"role": "assistant", "content": "hello"}}]})
ENDPOINTS = 8
STREAMS = 100  # ext_proc streams per Envoy connection before a new one: every serving worker gets a share
MODES = {
    # What a gateway needs for routing alone: the request phase.
    "request": processing_mode("FULL_DUPLEX_STREAMED", response_headers=False),
    # Upstream's configuration: both directions streamed through the picker.
    "full": processing_mode("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED"),
}


def _backend_listener(name: str, port: int, answer: str, metrics_page: str) -> dict[str, Any]:
    """A model-server stand-in: `/metrics` answers a vLLM page, everything else the canned completion."""
    config = listener(name, port, {"direct_response": {"status": 200, "body": {"inline_string": answer}}}, [])
    route_config = config["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    route_config["max_direct_response_body_size_bytes"] = 1 << 20  # a vLLM page is ~27 KB; Envoy's default is 4 KB
    routes = route_config["virtual_hosts"][0]["routes"]
    page = {"direct_response": {"status": 200, "body": {"inline_string": metrics_page}}}
    routes.insert(0, {"match": {"prefix": "/metrics"}, **page})
    return config


def hey(url: str, seconds: float, concurrency: int, body_file: Path) -> dict[str, float]:
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
         "-D", str(body_file), "-disable-keepalive=false", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    if re.search(r"50%+ in ([\d.]+) secs", out) is None:  # no request succeeded: say what hey saw
        raise RuntimeError(f"{url}: no latency distribution from hey:\n{out[-1500:]}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = float(re.search(r"50%+ in ([\d.]+) secs", out).group(1))  # type: ignore[union-attr]
    # under 100 answers (a starved box) hey prints no 99 % line: the slowest stands in
    p99 = float((re.search(r"99%+ in ([\d.]+) secs", out) or re.search(r"Slowest:\s+([\d.]+) secs", out)).group(1))  # type: ignore[union-attr]
    codes = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", out))
    return {
        "rps": rps,
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "non200": sum(int(v) for k, v in codes.items() if k != "200"),
    }


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes, in seconds (a process gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine, all cores, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _picker_pids(proc_pid: int, metrics_port: int) -> list[int]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as r:
            workers = json.loads(r.read()).get("workers") or []
    except OSError:
        workers = []
    return [proc_pid, *(w["pid"] for w in workers if w.get("pid"))]


def _pid_of(marker: str) -> int | None:
    """The process whose command line contains `marker` (Envoy's bootstrap path: unique to this run)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    return None


def run(
    seconds: float,
    concurrencies: list[int],
    modes: list[str],
    extra_epp_args: tuple[str, ...] = (),
    rounds: int = 3,
    workers: tuple[int, ...] = (1,),
    envoy_concurrency: int = 1,
    transports: tuple[str, ...] = (),
    raw_noop: bool = False,
) -> list[dict[str, Any]]:
    """`transports` empty: the picker's default transport, columns named by worker count alone."""
    if shutil.which("hey") is None:
        sys.exit("needs `hey` (apt-get install hey)")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="epp-bench-") as tmp_name:
        tmp = Path(tmp_name)
        body_file = tmp / "body.json"
        body_file.write_text(BODY)
        backends = [free_port() for _ in range(ENDPOINTS)]
        backend = backends[0]  # (a) and (b) send everything to the first; (c) lets the picker choose
        noop_port, raw_port = free_port(), free_port()
        variants = [(t, w) for t in transports or ("",) for w in workers]  # (transport, workers)
        # each variant → (ext_proc port, metrics port)
        pickers = {v: (free_port(), free_port()) for v in variants}
        names = {v: f"epp-{v[0]}-w{v[1]}" if v[0] else ("epp" if v[1] == 1 else f"epp-w{v[1]}") for v in variants}
        with contextlib.ExitStack() as stack:
            noop_proc = stack.enter_context(
                running([sys.executable, "-m", "benchmarks.noop_extproc", str(noop_port)], tmp / "noop.log")
            )
            raw_proc = (
                stack.enter_context(
                    running([sys.executable, "-m", "benchmarks.noop_extproc", str(raw_port), "--raw"], tmp / "raw.log")
                )
                if raw_noop
                else None
            )
            procs = {}
            for (t, w), (epp_port, metrics_port) in pickers.items():
                transport = ("--extproc-transport", t) if t else ()
                argv = serve_argv(epp_port, free_port(), metrics_port, "--static-endpoints",
                                  ",".join(f"127.0.0.1:{p}" for p in backends), "-v", "0", "--workers", str(w),
                                  *transport, *extra_epp_args)  # fmt: skip
                procs[t, w] = stack.enter_context(running(argv, tmp / f"epp-{t}-{w}.log"))
            wait_until(lambda: port_open(noop_port), 60, "noop ext_proc", noop_proc)
            if raw_proc is not None:
                wait_until(lambda: port_open(raw_port), 60, "raw noop ext_proc", raw_proc)
            for (t, w), (_, metrics_port) in pickers.items():
                url = f"http://127.0.0.1:{metrics_port}/readyz"
                wait_until(lambda url=url: http_ok(url), 60, f"epp --workers {w}", procs[t, w])
                if w > 1:
                    v = (t, w)
                    wait_until(lambda v=v: len(_picker_pids(procs[v].pid, pickers[v][1])) == v[1] + 1, 60, "workers")
            for mode_name in modes:
                mode = MODES[mode_name]
                ports = {"none": free_port(), "noop": free_port(), **{names[v]: free_port() for v in variants}}
                if raw_noop:
                    ports["noop-raw"] = free_port()
                pool_listeners = [
                    _backend_listener(f"backend{i}", port, ANSWER, vllm_page(waiting=i % 3, running=4 + i))
                    for i, port in enumerate(backends)
                ]
                to_backend = {"route": {"cluster": "backend", "timeout": "10s"}}
                to_pool = {"route": {"cluster": "pool", "timeout": "10s"}}
                config = bootstrap(
                    [
                        *pool_listeners,
                        listener("none", ports["none"], to_backend, []),
                        listener("noop", ports["noop"], to_backend, [ext_proc_filter("noop", mode)]),
                        *(
                            [listener("noop-raw", ports["noop-raw"], to_backend, [ext_proc_filter("noop-raw", mode)])]
                            if raw_noop
                            else []
                        ),
                        *(
                            listener(names[v], ports[names[v]], to_pool, [ext_proc_filter(names[v], mode)])
                            for v in variants
                        ),
                    ],
                    [
                        static_cluster("backend", backend),
                        pool_cluster(),
                        static_cluster("noop", noop_port, http2=True, tls=True, streams_per_connection=STREAMS),
                        *(
                            [static_cluster("noop-raw", raw_port, http2=True, tls=True, streams_per_connection=STREAMS)]
                            if raw_noop
                            else []
                        ),
                        # the picker's default: TLS; connections renewed as `epp envoy-config` renders them
                        *(
                            static_cluster(
                                names[v], pickers[v][0], http2=True, tls=True, streams_per_connection=STREAMS
                            )
                            for v in variants
                        ),
                    ],
                    free_port(),
                )
                with run_envoy(tmp, config, mode_name, envoy_concurrency):
                    envoy_pid = _pid_of(str(tmp / f"envoy-{mode_name}.yaml"))
                    for c in concurrencies:
                        row: dict[str, Any] = {"mode": mode_name, "concurrency": c, "pickers": list(names.values())}
                        runs: dict[str, list[dict[str, float]]] = {name: [] for name in ports}
                        cpu: dict[str, float] = {name: 0.0 for name in ports}  # the ext_proc server's processes
                        envoy_cpu: dict[str, float] = {name: 0.0 for name in ports}
                        done: dict[str, float] = {name: 0.0 for name in ports}
                        for port in ports.values():
                            with contextlib.suppress(RuntimeError):  # warm-up: too few answers on a busy box is fine
                                hey(f"http://127.0.0.1:{port}/v1/chat/completions", 2, c, body_file)
                        # Rounds interleave (a), (b), (c) so that a burst of noise from elsewhere on the machine
                        # hits all three; each figure is the median over the rounds.
                        # The load on the machine while the rounds ran: its 1-minute load average at each run's
                        # start and the share of all its cores busy (ours and everyone else's), each run.
                        loads: list[float] = []
                        busy: list[float] = []
                        for _ in range(rounds):
                            for name, port in ports.items():
                                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                                v = next((k for k, n in names.items() if n == name), None)
                                pids = _picker_pids(procs[v].pid, pickers[v][1]) if v else []
                                if name == "noop":
                                    pids = [noop_proc.pid]
                                elif name == "noop-raw" and raw_proc is not None:
                                    pids = [raw_proc.pid]
                                envoy_pids = [envoy_pid] if envoy_pid else []
                                before, envoy_before = _cpu_seconds(pids), _cpu_seconds(envoy_pids)
                                loads.append(_load_1m())
                                machine_before = _machine_jiffies()
                                runs[name].append(hey(url, seconds, c, body_file))
                                machine_after = _machine_jiffies()
                                busy.append(
                                    (machine_after[0] - machine_before[0])
                                    / max(1, machine_after[1] - machine_before[1])
                                )
                                cpu[name] += _cpu_seconds(pids) - before
                                envoy_cpu[name] += _cpu_seconds(envoy_pids) - envoy_before
                                done[name] += runs[name][-1]["rps"] * seconds
                        row["load_1m"] = [min(loads), statistics.median(loads), max(loads)]
                        row["machine_busy"] = statistics.median(busy)
                        row["cores"] = os.cpu_count()
                        for name, results_of in runs.items():
                            row[name] = {k: statistics.median(r[k] for r in results_of) for k in results_of[0]}
                            row[name]["rps_all"] = [r["rps"] for r in results_of]
                        for name in cpu:
                            if name != "none":
                                row[name]["cpu_ms_per_request"] = 1000 * cpu[name] / max(1.0, done[name])
                            row[name]["envoy_cpu_ms_per_request"] = 1000 * envoy_cpu[name] / max(1.0, done[name])
                            row[name]["ratio_to_noop"] = row[name]["rps"] / row["noop"]["rps"]
                        for name in [*names.values(), *(["noop-raw"] if raw_noop else [])]:
                            row[name]["cpu_ratio_to_noop"] = (
                                row[name]["cpu_ms_per_request"] / row["noop"]["cpu_ms_per_request"]
                            )
                        first = names[variants[0]]
                        row["ratio_c_b"] = row[first]["rps"] / row["noop"]["rps"]
                        results.append(row)
                        print(json.dumps(row), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    pickers = results[0]["pickers"] if results else ["epp"]
    head = " | ".join(f"(c) {k} req/s (CPU ms/req)" for k in pickers)
    lines = [
        f"| modes | c | (a) no ext_proc req/s (p50/p99 ms) | (b) no-op ext_proc | {head} | (c)/(b) |",
        "|---|---|---|---|" + "---|" * len(pickers) + "---|",
    ]
    for r in results:
        cells = [f"{r[k]['rps']:,.0f} ({r[k]['p50_ms']:.1f}/{r[k]['p99_ms']:.1f})" for k in ("none", "noop")]
        cells += [f"{r[k]['rps']:,.0f} ({r[k].get('cpu_ms_per_request', float('nan')):.2f})" for k in pickers]
        lines.append(f"| {r['mode']} | {r['concurrency']} | {' | '.join(cells)} | {r['ratio_c_b']:.2f} |")
    lines += [
        "",
        "| modes | c | setting | req/s | ext_proc CPU µs/req | Envoy CPU µs/req | ext_proc CPU / no-op's |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for k in ("none", "noop", *(["noop-raw"] if "noop-raw" in r else []), *pickers):
            us = r[k].get("cpu_ms_per_request")
            own = f"{1000 * us:,.0f}" if us is not None else "—"
            ratio = f"{r[k]['cpu_ratio_to_noop']:.2f}" if "cpu_ratio_to_noop" in r[k] else "—"
            envoy = 1000 * r[k]["envoy_cpu_ms_per_request"]
            lines.append(
                f"| {r['mode']} | {r['concurrency']} | {k} | {r[k]['rps']:,.0f} | {own} | {envoy:,.0f} | {ratio} |"
            )
    for r in results:
        low, mid, high = r["load_1m"]
        lines.append(
            f"\nload during {r['mode']} c={r['concurrency']}: 1-min load average {low:.1f}-{high:.1f} (median "
            f"{mid:.1f}) on {r['cores']} cores, {100 * r['machine_busy']:.0f} % of all cores busy (median run)"
        )
        for k in pickers:
            per_request = r[k].get("cpu_ms_per_request")
            if per_request:
                lines.append(
                    f"  {k}: {per_request:.2f} ms of picker CPU per request = {1000 / per_request:,.0f} req/s per "
                    f"core of picker CPU; x 16 cores: {16 * 1000 / per_request:,.0f} req/s (if Envoy and the clients "
                    "have cores of their own)"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=positive_duration, default=10, help="length of one load run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per setting (median reported)")
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--modes", default="request,full")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--epp-args", default="", help="extra `epp serve` flags, e.g. '--config-file FILE'")
    parser.add_argument("--workers", default="1", help="epp serve --workers counts to compare, e.g. 1,2,4")
    parser.add_argument("--envoy-concurrency", type=int, default=2, help="Envoy worker threads (default 2)")
    parser.add_argument(
        "--transports",
        default="",
        help="--extproc-transport values to compare, e.g. grpc,native (default: the default)",
    )
    parser.add_argument(
        "--raw-noop", action="store_true", help="also (b'): the no-op on raw bytes (noop_extproc.py --raw)"
    )
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workers = tuple(int(w) for w in args.workers.split(","))
    results = run(
        args.seconds,
        concurrencies,
        args.modes.split(","),
        tuple(args.epp_args.split()),
        args.rounds,
        workers,
        args.envoy_concurrency,
        tuple(t for t in args.transports.split(",") if t),
        args.raw_noop,
    )
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
