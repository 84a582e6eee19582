"""What several pools cost one picker: µs per decision and memory with 1, 10 and 100 pools of 8 endpoints.

Side by side in one run (the machine is shared; compare ratios, not absolutes). Each cell is one table holding
every pool's endpoints (8 per pool, scraped metrics, slots interleaved across pools), one Director per pool with
our default profile (each its own scheduler and prefix index, as `epp serve` builds them), and the router that
reads the pool from the stream's gRPC metadata. A decision is what the ext_proc adapter does per stream:
`router.route(metadata)`, the pipeline's `immediate(request)` (the pool's director), then `complete` (the booking
released). Requests go to the pools in turn, 4 KB prompts sharing a system prefix. The one-pool baseline is
today's single-pool path (no metadata read, no pool key on the endpoints).

Memory: what `tracemalloc` counts for the table, the directors and the router once built, and again after the
picks (300, the prefix indexes having learned them), per pool; a separate pass, since tracemalloc slows the timing.

    .venv/bin/python benchmarks/pools.py [--picks N]

Bounded: N picks per cell (default 3,000) after 300 warm-up picks; no network.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import string
import time
import timeit
import tracemalloc
from typing import Any

import numpy as np

from epp import wire
from epp.datastore import EndpointTable
from epp.datastore.pools import PoolSlots
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director import Director
from epp.director.pools import PoolLessMode, PoolRoute, PoolRouter
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler

POOLS = (1, 10, 100)
PER_POOL = 8


class _Null:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _table(pools: int, keyed: bool, rng: random.Random) -> EndpointTable:
    table = EndpointTable(initial_capacity=pools * PER_POOL)
    infos = [
        EndpointInfo(address=f"127.21.{p}.{i + 1}:8000", pool=f"default/pool-{p}" if keyed else "")
        for p in range(pools)
        for i in range(PER_POOL)
    ]
    rng.shuffle(infos)
    for info in infos:
        slot = table.upsert(info)
        sample = MetricsSample(waiting=float(rng.randint(0, 8)), running=float(rng.randint(0, 32)),
                               kv_usage=rng.random(), max_lora=4.0, block_size=16.0, num_blocks=20_000.0)  # fmt: skip
        table.record_scrape(slot, sample, now=100.0)
    table.synced = True
    return table


def _build(pools: int, keyed: bool, rng: random.Random) -> tuple[Any, Any]:
    """(the table, a function metadata → pipeline) for one cell."""
    table = _table(pools, keyed, rng)
    if not keyed:
        director = Director(table, build_scheduler(None, seed=1), clock=lambda: 100.0)
        return table, lambda _metadata: director.pipeline
    routes = {}
    for p in range(pools):
        key = f"default/pool-{p}"
        director = Director(table, build_scheduler(None, seed=1), clock=lambda: 100.0, pool=key)
        routes[key] = PoolRoute(director.pipeline, _Null())
    router = PoolRouter(routes.get, "default", PoolLessMode.FAIL_CLOSE, _Null(), lambda: 100.0)
    return table, lambda metadata: router.route(metadata).pipeline


def _prompts(count: int, rng: random.Random) -> list[str]:
    system = "".join(rng.choices(string.ascii_letters + " ", k=2048))
    return [system + "".join(rng.choices(string.ascii_letters + " ", k=2048)) for _ in range(count)]


def cell(pools: int, keyed: bool, picks: int, traced: bool) -> dict[str, float]:
    """Timed (`traced` False) or measured for memory (`traced` True: tracemalloc slows every allocation, so the
    two are separate passes over the same cell)."""
    rng = random.Random(pools)
    prompts = _prompts(64, rng)
    gc.collect()
    if traced:
        tracemalloc.start()
    table, pipeline_for = _build(pools, keyed, rng)
    built = tracemalloc.get_traced_memory()[0] if traced else 0
    metadata = [((wire.POOL_METADATA, f"default/pool-{p}"),) for p in range(pools)]
    requests = [
        InferenceRequest(request_id=str(i), api=ApiKind.COMPLETIONS, model="m", prompt=prompts[i % len(prompts)])
        for i in range(picks + 300)
    ]
    batches: list[float] = []
    outside = 0
    started = 0.0
    for i, request in enumerate(requests):
        if i >= 300 and (i - 300) % 10 == 0:
            started = time.perf_counter()
        md = metadata[i % pools]
        pipeline = pipeline_for(md)
        assert pipeline.immediate is not None
        decision = pipeline.immediate(request, None)
        pipeline.complete(decision)
        if i >= 300 and (i - 300) % 10 == 9:
            batches.append((time.perf_counter() - started) / 10 * 1e6)
        if keyed:
            info = table.info(decision.slot)
            outside += info is None or info.pool != md[0][1]
    after = tracemalloc.get_traced_memory()[0] if traced else 0
    if traced:
        tracemalloc.stop()
    assert outside == 0, f"{outside} picks outside their pool"
    return {"best": min(batches), "median": statistics.median(batches), "built": built, "after": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picks", type=int, default=3000)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, load {load:.2f}")
    print(f"µs per decision (route + decide + complete): best 10-decision batch (median); {args.picks} per cell")
    print("pools  endpoints  path                     µs/decision      memory built   after picks   per pool")
    rows = [(1, False, "one pool (today's path)")] + [(n, True, "several pools, by metadata") for n in POOLS]
    cell(1, False, 300, traced=False)  # warm-up: first-use costs (imports, caches) land in no cell
    base = None
    for pools, keyed, label in rows:
        r = cell(pools, keyed, args.picks, traced=False)
        r.update({k: v for k, v in cell(pools, keyed, 300, traced=True).items() if k in ("built", "after")})
        base = base or r["best"]
        print(
            f"{pools:5d}  {pools * PER_POOL:9d}  {label:<24} {r['best']:6.1f} ({r['median']:5.1f})"
            f"  {r['built'] / 1e6:9.2f} MB  {r['after'] / 1e6:9.2f} MB  {r['after'] / pools / 1e3:7.0f} KB"
            f"   {r['best'] / base:4.2f}× the one-pool path"
        )
    for pools in POOLS:
        route, candidates = routing_alone(pools)
        print(f"{pools:5d} pools: route(metadata) {route:.2f} µs, the pool's candidates {candidates:.2f} µs")


def routing_alone(pools: int) -> tuple[float, float]:
    """µs of what several pools add to a stream: `route(metadata)` (best of 5 rounds over every pool), and a
    pool's candidates from an unchanged table (`PoolSlots.of`, cached per membership)."""
    table, pipeline_for = _build(pools, True, random.Random(pools))
    metadata = [((wire.POOL_METADATA, f"default/pool-{p}"),) for p in range(pools)]
    rounds = max(1, 2000 // pools)
    route = min(timeit.repeat(lambda: [pipeline_for(md) for md in metadata], number=rounds, repeat=5)) / (
        rounds * pools
    )
    slots = PoolSlots("default/pool-0")
    candidates = min(timeit.repeat(lambda: slots.of(table.view()), number=20_000, repeat=5)) / 20_000
    return route * 1e6, candidates * 1e6


if __name__ == "__main__":
    main()
