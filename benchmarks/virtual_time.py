"""The discrete-event run: a pool of engine models, a policy, arrivals, scrapes — all in virtual time.

One event heap holds three kinds of events: a server's step ends, a request arrives, the picker scrapes. Servers
step only while they have work, so idle time costs nothing; a step costs O(admissions + completions) in the
engine model. Nothing here reads a clock: the run is deterministic for a seed, whatever the machine's load.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.policies import Policy
from benchmarks.workloads import Item, sim_request
from epp.sim.engine import Engine
from epp.sim.profiles import EngineProfile

_STEP, _ARRIVAL, _SCRAPE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class RunResult:
    ttft: np.ndarray  # per request, by arrival order
    e2e: np.ndarray
    server: np.ndarray  # -1: the request was refused (shed)
    output_tokens: np.ndarray
    makespan: float  # first arrival to last completion
    hit_tokens: int
    query_tokens: int


def simulate(
    items: Sequence[Item],
    arrivals: np.ndarray,
    profiles: Sequence[EngineProfile],
    policy_factory: object,
    scrape_interval: float = 0.05,
    unique_prefix: bool = False,
) -> RunResult:
    """Run every item through the pool under one policy. `policy_factory(engines, clock) -> Policy`; a pick of
    -1 refuses the request (it is shed: no server, no TTFT)."""
    engines = [Engine(p) for p in profiles]
    now = 0.0

    def clock() -> float:
        return now

    policy: Policy = policy_factory(engines, clock)  # type: ignore[operator]
    events = policy.wants_kv_events
    if events:
        for engine in engines:
            engine.kv_events = []
    n = len(items)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    server_of = np.full(n, -1, dtype=np.int64)
    out_tokens = np.zeros(n, dtype=np.int64)
    seq = itertools.count()
    heap: list[tuple[float, int, int, int]] = [(float(arrivals[i]), next(seq), _ARRIVAL, i) for i in range(n)]
    heapq.heapify(heap)
    if policy.reads_scrapes:
        heapq.heappush(heap, (0.0, next(seq), _SCRAPE, 0))
    remaining = n
    last = 0.0
    while heap and remaining:
        now, _, kind, arg = heapq.heappop(heap)
        if kind == _STEP:
            engine = engines[arg]
            outcome = engine.end_step(now)
            for i in outcome.first_tokens:  # the stream's first response byte
                policy.first_token(arg, i, now - float(arrivals[i]))
            for fin in outcome.finished:
                i = fin.request_id
                ttft[i] = fin.first_token_at - fin.arrived
                e2e[i] = fin.finished_at - fin.arrived
                out_tokens[i] = fin.output_tokens
                policy.done(arg, i, fin)
                remaining -= 1
                last = now
            if events and engine.kv_events:
                policy.kv_records(arg, list(engine.kv_events), now)
                engine.kv_events.clear()
            if engine.busy:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, arg))
        elif kind == _ARRIVAL:
            item = items[arg]
            req = sim_request(arg, item, unique_prefix, with_tokens=events)
            s = policy.pick(arg, item, req, now)
            server_of[arg] = s
            if s < 0:  # refused (a sheddable request shed): never served, its TTFT stays NaN
                remaining -= 1
                continue
            engine = engines[s]
            engine.submit(req, now)
            if not engine.stepping:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, s))
        else:
            policy.scrape(engines, now)
            heapq.heappush(heap, (now + scrape_interval, next(seq), _SCRAPE, 0))
    return RunResult(
        ttft=ttft,
        e2e=e2e,
        server=server_of,
        output_tokens=out_tokens,
        makespan=last - float(arrivals[0]),
        hit_tokens=sum(e.prefix_hits_tokens for e in engines),
        query_tokens=sum(e.prefix_queries_tokens for e in engines),
    )


def capacity(items: Sequence[Item], profile: EngineProfile, sample: int = 300, seed: int = 0) -> float:
    """Requests/s one server sustains on this workload with no cache hits: a saturating burst, all at t=0."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(items), size=min(sample, len(items)), replace=False)
    subset = [items[i] for i in sorted(chosen)]
    from benchmarks.policies import RoundRobin

    result = simulate(subset, np.zeros(len(subset)), [profile], lambda e, c: RoundRobin(1, seed), unique_prefix=True)
    return len(subset) / result.makespan
