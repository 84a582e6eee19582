"""µs per pick of the scheduling profile, at 8 / 64 / 512 / 4,096 endpoints and 1 KB / 4 KB / 16 KB / 128 KB prompts.

Everything is measured side by side in one run (the machine is shared; compare ratios, not absolutes). Each cell
times `scheduler.pick(snapshot, candidates, request, now)` on a table with scraped metrics for every endpoint and a
prefix index warmed by earlier picks: prompts share a system prefix, then differ, as chat traffic does. The director
and the table snapshot are not included (they are the same for every profile).

    .venv/bin/python benchmarks/pick.py [--picks N] [--profile ours|upstream]

Bounded: N picks per cell (default 2,000) after 200 warm-up picks; no network, no clock besides perf_counter.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import string
import time

import numpy as np

from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler, default_config, upstream_default_config

ENDPOINTS = (8, 64, 512, 4096)
PROMPTS_KB = (1, 4, 16, 128)


def make_table(n: int, rng: random.Random) -> EndpointTable:
    table = EndpointTable(initial_capacity=n)
    for i in range(n):
        slot = table.upsert(EndpointInfo(address=f"127.20.{i // 250}.{i % 250 + 1}:8000"))
        sample = MetricsSample(
            waiting=float(rng.randint(0, 8)),
            running=float(rng.randint(0, 32)),
            kv_usage=rng.random(),
            max_lora=4.0,
            block_size=16.0,
            num_blocks=20_000.0,
        )
        table.record_scrape(slot, sample, now=100.0)
    return table


def make_prompts(kb: int, count: int, rng: random.Random) -> list[str]:
    system = "".join(rng.choices(string.ascii_letters + " ", k=kb * 1024 // 2))
    out = []
    for _ in range(count):
        tail = "".join(rng.choices(string.ascii_letters + " ", k=kb * 1024 - len(system)))
        out.append(system + tail)
    return out


def bench_cell(n: int, kb: int, picks: int, profile: str) -> float:
    rng = random.Random(n * 1000 + kb)
    table = make_table(n, rng)
    config = default_config() if profile == "ours" else upstream_default_config()
    scheduler = build_scheduler(config, seed=1)
    prompts = make_prompts(kb, 64, rng)
    requests = [
        InferenceRequest(request_id=str(i), api=ApiKind.COMPLETIONS, model="m", prompt=prompts[i % len(prompts)])
        for i in range(picks + 200)
    ]
    snapshot = table.snapshot()
    candidates = snapshot.slots
    now = 100.05
    for req in requests[:200]:  # warm the prefix index
        scheduler.pick(snapshot, candidates, req, now)
    samples = []
    batch = 50
    perf = time.perf_counter
    for start in range(200, 200 + picks, batch):
        t0 = perf()
        for req in requests[start : start + batch]:
            scheduler.pick(snapshot, candidates, req, now)
        samples.append((perf() - t0) / batch * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--profile", choices=("ours", "upstream"), default="ours")
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, profile={args.profile}, picks/cell={args.picks}"
    )
    print("µs per pick (median of 50-pick batches)")
    header = "endpoints " + "".join(f"{kb:>9} KB" for kb in PROMPTS_KB)
    print(header)
    results: dict[tuple[int, int], float] = {}
    for n in ENDPOINTS:
        row = f"{n:>9} "
        for kb in PROMPTS_KB:
            results[n, kb] = bench_cell(n, kb, args.picks, args.profile)
            row += f"{results[n, kb]:>12.1f}"
        print(row, flush=True)
    print(f"target 64 endpoints × 4 KB ≤ 60 µs: {results[64, 4]:.1f} µs")
    for kb in PROMPTS_KB:
        print(f"{kb:>4} KB: 4096/64 endpoints = {results[4096, kb] / results[64, kb]:.2f}× (target ≤ 8×)")


if __name__ == "__main__":
    main()
