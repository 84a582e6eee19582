"""What the picker costs per request through a real Envoy, against the price of ext_proc itself.

Side by side in one run, the same Envoy, backend and load generator:
  (a) Envoy → backend, no ext_proc;
  (b) Envoy + a no-op Python ext_proc server (benchmarks/noop_extproc.py) with the same processing modes;
  (c) Envoy + `epp serve` (parse, decide, route by its metadata).
The ratio (c)/(b) is the figure of merit: (b) is what any Python ext_proc server pays; the rest is ours.
The backend is an Envoy direct-response listener, so it never limits the run.

Needs `hey` (Debian package `hey`). Run:
    .venv/bin/python -m benchmarks.extproc_overhead [--seconds 10] [--concurrency 16,64] [--modes request,full]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from epp.gateway.testbed import (
    bootstrap,
    ext_proc_filter,
    listener,
    pool_cluster,
    processing_mode,
    static_cluster,
)
from tests.support.envoy import run_envoy
from tests.support.procs import epp_argv, free_port, http_ok, port_open, running, wait_until

BODY = json.dumps(
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "Say hello. " * 60}]}
)
ANSWER = json.dumps({"id": "x", "choices": [{"message": {"role": "assistant", "content": "hello"}}]})
MODES = {
    # What a gateway needs for routing alone: the request phase.
    "request": processing_mode("FULL_DUPLEX_STREAMED", response_headers=False),
    # Upstream's configuration: both directions streamed through the picker.
    "full": processing_mode("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED"),
}


def hey(url: str, seconds: float, concurrency: int, body_file: Path) -> dict[str, float]:
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", "application/json",
         "-D", str(body_file), "-disable-keepalive=false", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = float(re.search(r"50%+ in ([\d.]+) secs", out).group(1))  # type: ignore[union-attr]
    p99 = float(re.search(r"99%+ in ([\d.]+) secs", out).group(1))  # type: ignore[union-attr]
    codes = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", out))
    return {
        "rps": rps,
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "non200": sum(int(v) for k, v in codes.items() if k != "200"),
    }


def run(seconds: float, concurrencies: list[int], modes: list[str]) -> list[dict[str, Any]]:
    if shutil.which("hey") is None:
        sys.exit("needs `hey` (apt-get install hey)")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        body_file = tmp / "body.json"
        body_file.write_text(BODY)
        backend, noop_port, epp_port = free_port(), free_port(), free_port()
        metrics_port = free_port()
        noop = running([sys.executable, "-m", "benchmarks.noop_extproc", str(noop_port)], tmp / "noop.log")
        epp = running(
            epp_argv("serve", "--bind-address", "127.0.0.1", "--grpc-port", str(epp_port), "--grpc-health-port",
                     str(free_port()), "--metrics-port", str(metrics_port), "--static-endpoints",
                     f"127.0.0.1:{backend}", "-v", "0"),
            tmp / "epp.log",
        )  # fmt: skip
        with noop as noop_proc, epp as epp_proc:
            wait_until(lambda: port_open(noop_port), 20, "noop ext_proc", noop_proc)
            wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 20, "epp", epp_proc)
            for mode_name in modes:
                mode = MODES[mode_name]
                ports = {"none": free_port(), "noop": free_port(), "epp": free_port()}
                direct = {"direct_response": {"status": 200, "body": {"inline_string": ANSWER}}}
                to_backend = {"route": {"cluster": "backend", "timeout": "10s"}}
                to_pool = {"route": {"cluster": "pool", "timeout": "10s"}}
                config = bootstrap(
                    [
                        listener("backend", backend, direct, []),
                        listener("none", ports["none"], to_backend, []),
                        listener("noop", ports["noop"], to_backend, [ext_proc_filter("noop", mode)]),
                        listener("epp", ports["epp"], to_pool, [ext_proc_filter("epp", mode)]),
                    ],
                    [
                        static_cluster("backend", backend),
                        pool_cluster(),
                        static_cluster("noop", noop_port, http2=True),
                        static_cluster("epp", epp_port, http2=True),
                    ],
                    free_port(),
                )
                with run_envoy(tmp, config, mode_name):
                    for c in concurrencies:
                        row: dict[str, Any] = {"mode": mode_name, "concurrency": c}
                        for name, port in ports.items():
                            hey(f"http://127.0.0.1:{port}/v1/chat/completions", 2, c, body_file)  # warm-up
                            row[name] = hey(f"http://127.0.0.1:{port}/v1/chat/completions", seconds, c, body_file)
                        row["ratio_c_b"] = row["epp"]["rps"] / row["noop"]["rps"]
                        results.append(row)
                        print(json.dumps(row), flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| modes | c | (a) no ext_proc req/s (p50/p99 ms) | (b) no-op ext_proc | (c) epp serve | (c)/(b) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [f"{r[k]['rps']:,.0f} ({r[k]['p50_ms']:.1f}/{r[k]['p99_ms']:.1f})" for k in ("none", "noop", "epp")]
        lines.append(f"| {r['mode']} | {r['concurrency']} | {' | '.join(cells)} | {r['ratio_c_b']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--modes", default="request,full")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = run(args.seconds, [int(c) for c in args.concurrency.split(",")], args.modes.split(","))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
