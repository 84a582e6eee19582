"""µs per pick of the scheduling profile at 8 / 64 / 512 / 4,096 endpoints and 1 / 4 / 16 / 128 KB prompts.

Everything is measured side by side in one run (the machine is shared; compare ratios, not absolutes). Each cell
times `scheduler.pick(snapshot, candidates, request, now)` on a table with scraped metrics for every endpoint and a
prefix index warmed by earlier picks: prompts share a system prefix, then differ, as chat traffic does. The director
and the table snapshot are not included (they are the same for every profile).

    .venv/bin/python benchmarks/pick.py [--picks N]

Each cell runs both our default profile and upstream's default profile (queue 2, kv 2, prefix 3, max-score) on the
same table and prompts, and a uniform random pick as the floor (the cost of calling into a scheduler at all).
Reported: the best 10-pick batch (the least disturbed by other processes on a shared machine) and the median.
Bounded: N picks per cell and profile (default 2,000) after 200 warm-up picks; no network.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import string
import time
from typing import Any

import numpy as np

from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler, default_config, upstream_default_config
from tests.support.schedulers import RandomScheduler

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


def bench_cell(n: int, kb: int, picks: int, profile: str) -> tuple[float, float]:
    rng = random.Random(n * 1000 + kb)
    table = make_table(n, rng)
    scheduler: Any
    if profile == "random":
        scheduler = RandomScheduler(seed=1)
    elif profile in ("slo", "slo-base", "slo-producer"):
        scheduler = _slo_scheduler(n, profile)
    else:
        scheduler = build_scheduler(
            default_config() if profile == "ours" else upstream_default_config(), seed=1
        ).handler
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
    batch = 10
    perf = time.perf_counter
    for start in range(200, 200 + picks, batch):
        t0 = perf()
        for req in requests[start : start + batch]:
            scheduler.pick(snapshot, candidates, req, now)
        samples.append((perf() - t0) / batch * 1e6)
    return min(samples), statistics.median(samples)


def _slo_scheduler(n: int, variant: str) -> Any:
    """benchmarks/slo.py's profile (ours with an approximate prefix producer, plus upstream's SLO plugins on the
    latency model, every endpoint with observations: `slo`), the same profile without the three SLO plugins
    (`slo-base`), or with the latency producer alone (`slo-producer`: the prediction's own cost)."""
    from benchmarks.slo import slo_config
    from epp.config.decode import parse_config
    from epp.datastore.observations import Observation, PickFeatures

    doc = slo_config()
    if variant != "slo":
        drop = {"slo-headroom-tier-filter", "latency-scorer"}
        if variant == "slo-base":
            drop.add("predicted-latency-producer")
        doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in drop]  # type: ignore[attr-defined]
        profile = doc["schedulingProfiles"][0]  # type: ignore[index]
        profile["plugins"] = [p for p in profile["plugins"] if p["pluginRef"] not in drop]
    scheduler = build_scheduler(parse_config(doc, "<pick>"), seed=1)
    rng = random.Random(n)
    for learner in scheduler.learners:
        for slot in range(n):
            for _ in range(4):
                pick = PickFeatures(1000, rng.randint(0, 1000), rng.random() * 8, 16.0, 0.5, 2, 0.0, 0.0, 2000)
                obs = Observation(slot, f"127.20.{slot // 250}.{slot % 250 + 1}:8000", pick, 0.1, 0.01, 64, True, 0, 0)
                learner.observe(obs)
    return scheduler.handler


def slo_cost(picks: int) -> None:
    """The SLO plugins' cost per pick at 64 endpoints × 4 KB: the same profile with and without them."""
    base = bench_cell(64, 4, picks, "slo-base")
    producer = bench_cell(64, 4, picks, "slo-producer")
    slo = bench_cell(64, 4, picks, "slo")
    print(
        f"64 endpoints × 4 KB: without the SLO plugins {base[0]:.1f} ({base[1]:.1f}) µs; with the latency producer "
        f"{producer[0]:.1f} ({producer[1]:.1f}) µs: the prediction adds {producer[0] - base[0]:.1f} µs (target "
        f"≤ 20 µs); with the tier filter and latency scorer too {slo[0]:.1f} ({slo[1]:.1f}) µs "
        f"(+{slo[0] - base[0]:.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--slo-only", action="store_true", help="only the SLO plugins' cost at 64 endpoints")
    args = parser.parse_args()
    if args.slo_only:
        slo_cost(args.picks)
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, load {load:.2f}")
    print(f"µs per pick: best 10-pick batch (median in brackets); {args.picks} picks per cell and profile")
    print(f"{'endpoints':>9} {'prompt':>7} {'ours':>16} {'upstream profile':>18} {'random floor':>14}")
    best: dict[tuple[int, int], float] = {}
    for n in ENDPOINTS:
        for kb in PROMPTS_KB:
            cells = {p: bench_cell(n, kb, args.picks, p) for p in ("ours", "upstream", "random")}
            best[n, kb] = cells["ours"][0]
            row = f"{n:>9} {kb:>5}KB"
            for p, width in (("ours", 16), ("upstream", 18), ("random", 14)):
                lo, med = cells[p]
                row += f"{f'{lo:.1f} ({med:.1f})':>{width + 1}}"
            print(row, flush=True)
    print(f"target 64 endpoints × 4 KB ≤ 60 µs: {best[64, 4]:.1f} µs")
    for kb in PROMPTS_KB:
        print(f"{kb:>4} KB: 4096 / 64 endpoints = {best[4096, kb] / best[64, kb]:.2f}× (target ≤ 8×)")
    slo_cost(args.picks)


if __name__ == "__main__":
    main()
