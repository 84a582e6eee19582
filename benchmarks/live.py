"""Routing quality on the wire: the picker behind real Envoy, Envoy's round robin, and the SGLang Model Gateway,
each on a fresh simulated pool, fed the same trace slice by an open-loop generator over real sockets.

    python -m benchmarks.live --workload mooncake --load 0.8 --seconds 60 \\
        --sglang-router /tmp/sgl-venv/bin/sglang-router --markdown benchmarks/out/live.md

The SGLang Model Gateway is not a dependency of this project: install it apart, e.g.
`python3 -m venv /tmp/sgl-venv && /tmp/sgl-venv/bin/pip install sglang-router==0.3.2`, and pass its binary with
`--sglang-router` (without it, or if it is not found, its policies are skipped with a note).

Every policy gets a new pool (cold caches), the same requests at the same planned times, and the same bounds: no
request starts after `--seconds`, none is waited for more than `--drain` seconds after that. The arrival rate is
`--load` × the pool's capacity without cache hits, measured as benchmarks/quality.py measures it, so the two runs
are comparable; the same slice is also run in virtual time (benchmarks/virtual_time.py) for round robin and the
picker, to check that the wire agrees with the simulation on the ordering of policies. With `--speed S` the
simulators run S times faster than real time; latencies are reported in simulated seconds (wall × S).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.quality import policy_factory
from benchmarks.virtual_time import capacity, simulate
from benchmarks.workloads import WORKLOADS, Item, load, prompt_text, scaled_arrivals
from epp.cli.flag_types import duration, positive_duration
from epp.demo.load import Outcome, Shot, run_phase
from epp.demo.processes import free_port, http_ok, running, wait_until
from epp.demo.report import PhaseSummary, prefix_counters, summarise
from epp.demo.stack import READY_TIMEOUT_S, gateway, picker, simulated_pool, wait_idle
from epp.sim.config import DEFAULT_MODEL
from epp.sim.profiles import profile_named

POLICIES = ("epp", "rr", "sglang-cache-aware", "sglang-rr")
SGLANG_POLICY = {"sglang-cache-aware": "cache_aware", "sglang-rr": "round_robin"}


@dataclass(frozen=True, slots=True)
class VirtualRow:
    policy: str
    ttft_p90: float
    ttft_p99: float
    e2e_p99: float
    throughput: float
    hit_rate: float


def shots_for(items: Sequence[Item], arrivals: np.ndarray) -> list[Shot]:
    """Streaming chat calls whose text carries the trace's prefix sharing (benchmarks.workloads.prompt_text)."""
    shots = []
    for i, (item, at) in enumerate(zip(items, arrivals, strict=True)):
        body = {
            "model": DEFAULT_MODEL,
            "stream": True,
            "max_tokens": item.output_tokens,
            "messages": [{"role": "user", "content": prompt_text(i, item)}],
        }
        shots.append(Shot(float(at), "/v1/chat/completions", json.dumps(body).encode()))
    return shots


@contextlib.contextmanager
def sglang_router(
    binary: str, workdir: Path, addresses: Sequence[str], policy: str, say: Callable[[str], None]
) -> Iterator[str]:
    port = free_port()
    argv = [binary, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--log-level", "warn"]
    argv += ["--worker-urls", *(f"http://{a}" for a in addresses)]
    with running(argv, workdir / f"sglang-{policy}.log") as proc:
        say(f"started sglang-router --policy {policy} (pid {proc.pid})")
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), READY_TIMEOUT_S, "sglang-router", proc)
        yield f"http://127.0.0.1:{port}"


def _in_sim_time(outcomes: Sequence[Outcome], speed: float) -> list[Outcome]:
    return [replace(o, ttft=o.ttft * speed, e2e=o.e2e * speed) for o in outcomes]


def run_policy(
    policy: str, shots: Sequence[Shot], args: argparse.Namespace, workdir: Path, say: Callable[[str], None]
) -> PhaseSummary:
    profiles = [p.strip() for p in args.profiles.split(",")]
    with contextlib.ExitStack() as stop_all:
        servers, _ = stop_all.enter_context(simulated_pool(workdir, profiles, args.speed, say))
        addresses = [s.address for s in servers]
        if policy in ("epp", "rr"):
            grpc_port, _ = stop_all.enter_context(picker(workdir, addresses, say))
            picker_url, rr_url, _ = stop_all.enter_context(gateway(workdir, addresses, grpc_port, say))
            url = picker_url if policy == "epp" else rr_url
        else:
            url = stop_all.enter_context(
                sglang_router(args.sglang_router, workdir, addresses, SGLANG_POLICY[policy], say)
            )
        before = prefix_counters(addresses)
        outcomes, wall = run_phase(url, shots, args.seconds, args.drain, policy)
        after = prefix_counters(addresses)
        wait_idle(addresses, 1.0)
    return summarise(
        policy, _in_sim_time(outcomes, args.speed), wall * args.speed, [s.name for s in servers], before, after
    )


def virtual_rows(items: Sequence[Item], arrivals: np.ndarray, profiles: Sequence[str]) -> list[VirtualRow]:
    pool = [profile_named(p) for p in profiles]
    rows = []
    for policy in ("epp", "rr"):
        r = simulate(items, arrivals, pool, policy_factory(policy, len(pool), 0, None))
        rows.append(
            VirtualRow(
                policy,
                float(np.percentile(r.ttft, 90)),
                float(np.percentile(r.ttft, 99)),
                float(np.percentile(r.e2e, 99)),
                len(items) / r.makespan,
                r.hit_tokens / max(1, r.query_tokens),
            )
        )
    return rows


def _ms(x: float) -> str:
    if math.isinf(x):
        return "timeout"
    return "n/a" if math.isnan(x) else f"{x * 1e3:.0f}"


def markdown(phases: Sequence[PhaseSummary], virtual: Sequence[VirtualRow], header: str) -> str:
    out = [
        header,
        "",
        "| policy (live) | ok / sent | failed | unfinished | TTFT p50 ms | p90 ms | p99 ms | e2e p50 ms | e2e p99 ms "
        "| done req/s | hit rate | requests per endpoint |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        spread = " ".join(str(v) for v in p.per_server.values())
        hit = "n/a" if math.isnan(p.hit_rate) else f"{p.hit_rate:.2f}"
        out.append(
            f"| {p.name} | {p.ok} / {p.planned} | {p.failed} | {p.unfinished} | {_ms(p.ttft_p50)} | {_ms(p.ttft_p90)} "
            f"| {_ms(p.ttft_p99)} | {_ms(p.e2e_p50)} | {_ms(p.e2e_p99)} | {p.throughput:.2f} | {hit} | {spread} |"
        )
    out += [
        "",
        "| policy (virtual time, same slice) | TTFT p90 ms | p99 ms | e2e p99 ms | done req/s | hit rate |",
        "|---|---|---|---|---|---|",
    ]
    for v in virtual:
        out.append(
            f"| {v.policy} | {_ms(v.ttft_p90)} | {_ms(v.ttft_p99)} | {_ms(v.e2e_p99)} | {v.throughput:.2f} "
            f"| {v.hit_rate:.2f} |"
        )
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.live", description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="mooncake", help=f"one of {', '.join(WORKLOADS)}")
    p.add_argument("--trace", help="an Azure CSV or Mooncake JSONL file (replaces the named workload's data)")
    p.add_argument("--load", type=float, default=0.8, help="fraction of the pool's capacity without cache hits")
    p.add_argument("--requests", type=int, default=400, help="trace requests taken, from --offset on")
    p.add_argument("--offset", type=int, default=0, help="first trace request of the slice (default 0)")
    p.add_argument(
        "--seconds", type=positive_duration, default=60.0, help="send window per policy, wall seconds (default 60)"
    )
    p.add_argument("--drain", type=duration, default=60.0, help="wall seconds to wait for answers after the window")
    p.add_argument("--profiles", default="h100,h100,h100,h100", help="one simulated server per entry")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--sglang-router", default=shutil.which("sglang-router") or "", help="the sglang-router binary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--markdown", help="write the tables as Markdown here")
    p.add_argument("--virtual-only", action="store_true", help="only the virtual-time run of the same slice")
    p.add_argument("--workdir", help="keep the processes' logs here (default: a temporary directory)")
    return p.parse_args(argv)


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds every `running` block: the children are stopped by PID, not orphaned


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("benchmarks.live: interrupted; stopped every process it started", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if args.virtual_only:
        policies = []
    if unknown or args.load <= 0 or args.seconds <= 0 or args.speed <= 0 or args.requests <= 0 or args.offset < 0:
        print(
            f"benchmarks.live: error: bad policies {unknown}, or a non-positive load/seconds/speed/requests, "
            "or a negative offset",
            file=sys.stderr,
        )
        return 2
    if any(p in SGLANG_POLICY for p in policies) and not Path(args.sglang_router or "/nonexistent").is_file():
        print(f"note: sglang-router not found ({args.sglang_router!r}): its policies are skipped", file=sys.stderr)
        policies = [p for p in policies if p not in SGLANG_POLICY]
    profiles = [p.strip() for p in args.profiles.split(",")]
    try:
        items = load(args.workload, args.offset + args.requests, Path(args.trace) if args.trace else None, args.seed)
        items = items[args.offset :]
        if not items:
            raise ValueError(f"--offset {args.offset} is past the end of the trace")
        pool_capacity = sum(capacity(items, profile_named(p), seed=args.seed) for p in profiles)
    except (ValueError, OSError) as exc:
        print(f"benchmarks.live: error: {exc}", file=sys.stderr)
        return 2
    rate = args.load * pool_capacity  # simulated req/s
    arrivals = scaled_arrivals(items, rate)
    sent = int(np.searchsorted(arrivals, args.seconds * args.speed, side="right"))
    header = (
        f"{args.workload} from request {args.offset}: {sent} of {len(items)} requests sent in {args.seconds:g} s "
        f"wall at speed {args.speed:g}, "
        f"load {args.load:g} of capacity {pool_capacity:.2f} req/s ({rate:.2f} req/s offered), pool {args.profiles}"
    )
    print(header, file=sys.stderr, flush=True)
    shots = shots_for(items, arrivals / args.speed)
    phases: list[PhaseSummary] = []
    with tempfile.TemporaryDirectory(prefix="epp-live-") as tmp:
        for policy in policies:
            workdir = Path(args.workdir or tmp) / policy
            workdir.mkdir(parents=True, exist_ok=True)
            phases.append(run_policy(policy, shots, args, workdir, lambda line: None))
    virtual = virtual_rows(items[:sent], arrivals[:sent], profiles)
    report = markdown(phases, virtual, header)
    print(report)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(report + "\n")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        rows = {"live": [asdict(p) for p in phases], "virtual": [asdict(v) for v in virtual], "header": header}
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
