"""What the federation step adds to one decision, measured side by side with the plain director in one run.

    .venv/bin/python -m benchmarks.federation_overhead [--requests 20000]

Cases: the director without federation; with federation but no site registered (a restricted model, served
locally); with 8 sites and no rule applying (local unsaturated); a restricted model served locally; and the
overflow path (local saturated, 8 sites ranked per request). Bounded by the request
count; prints µs per decision and the ratio to the plain director.
"""

from __future__ import annotations

import argparse
import statistics
import time

from epp.config.federation import parse_federation
from epp.datastore import EndpointInfo, EndpointTable, MetricsSample
from epp.datastore.sites import Site, SiteRegistry
from epp.director import Director
from epp.federation.policy import FederationRouter
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler
from tests.support.schedulers import RandomScheduler

NOW = 1_000.0
RULES = {
    "residency": {"rules": [{"name": f"r{i}", "modelPrefixes": [f"m{i}/"], "tiers": ["eu", "dc"]} for i in range(10)]}
}


def _table(n: int, waiting: float) -> EndpointTable:
    table = EndpointTable()
    for i in range(n):
        slot = table.upsert(EndpointInfo(address=f"127.10.{i // 250}.{i % 250 + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, running=1.0, kv_usage=0.2), NOW)
    return table


def _sites(n: int) -> SiteRegistry:
    reg = SiteRegistry()
    for i in range(n):
        reg.put(
            Site(
                name=f"s{i}",
                tier="dc",
                address=f"127.20.0.{i + 1}:8080",
                heartbeat_interval_s=30.0,
                last_heartbeat=NOW - 5,
                gpus_allocatable=i % 4 + 1,
                services_total=2,
                services_ready=2,
                services_failed=0,
            )
        )
    return reg


def _time(director: Director, request: InferenceRequest, n: int, waiting: float) -> float:
    """Every 32 decisions a "scrape" refreshes the rows (as the scraper would), in every case alike."""
    table = director.table
    sample = MetricsSample(waiting=waiting, running=1.0, kv_usage=0.2)
    start = time.perf_counter()
    for i in range(n):
        director.complete(director.decide(request))
        if i % 32 == 0:
            for slot in table.snapshot().slots:
                table.record_scrape(int(slot), sample, NOW)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--endpoints", type=int, default=64)
    args = parser.parse_args()
    config = parse_federation(RULES)

    def director(waiting: float, fed: bool, sites: int = 8) -> Director:
        router = FederationRouter(config, _sites(sites), local_tier="eu") if fed else None
        return Director(
            _table(args.endpoints, waiting), Scheduler(RandomScheduler(seed=1)), clock=lambda: NOW, federation=router
        )

    free = InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="llama", prompt="x")
    restricted = InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="m9/llama", prompt="x")
    cases = [
        ("plain director", director(0.0, False), free, 0.0),
        ("federation, no site registered", director(0.0, True, sites=0), restricted, 0.0),
        ("federation, no rule applies", director(0.0, True), free, 0.0),
        ("federation, restricted, local", director(0.0, True), restricted, 0.0),
        ("federation, overflow to 8 sites", director(50.0, True), free, 50.0),
    ]
    for _, d, r, w in cases:  # warm-up
        _time(d, r, 500, w)
    # Interleaved rounds, so a noisy neighbour on the shared machine hits every case alike; median and best round.
    rounds = 20
    per_round: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for _ in range(rounds):
        for name, d, r, w in cases:
            per_round[name].append(_time(d, r, max(1, args.requests // rounds), w))
    print(
        f"{args.requests} decisions per case in {rounds} interleaved rounds, {args.endpoints} local endpoints, 10 rules"
    )
    base_median = statistics.median(per_round[cases[0][0]])
    base_best = min(per_round[cases[0][0]])
    for name, *_ in cases:
        median, best = statistics.median(per_round[name]), min(per_round[name])
        ratio_median, ratio_best = median / base_median, best / base_best
        print(f"{name:32s} median {median:6.1f} µs ×{ratio_median:.2f}  best {best:6.1f} µs ×{ratio_best:.2f}")


if __name__ == "__main__":
    main()
