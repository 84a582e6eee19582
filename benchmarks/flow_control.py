"""Flow control in virtual time: the real queues (`epp.flowcontrol`), the real director and scheduler over a real
endpoint table fed by simulated scrapes, and the simulator's engine model — no clock, deterministic per seed.

Workloads (benchmarks/RESULTS.md, "Flow control"):
- `priority-overload`: 130 % of the pool's capacity, 20 % critical (priority 10) / 80 % sheddable (priority −1),
  TTL 2 s, `priority-holdback-policy` (maxCeiling 0.2, minCeiling 0.1); compared with critical traffic alone at
  50 % under the same policy (and, for reference, the overload under the default static threshold 1.0).
- `noisy-neighbour`: two fairness ids, one sending 10× the other, 120 % of capacity, round-robin fairness at
  three static usage-limit thresholds; compared with the light flow alone.
- `overshoot`: a burst of 3× what the pool holds at saturation 1.0, arriving within one scrape interval, on a
  pool at 60 % load; the engines' own queue peak with our gating vs upstream-style dispatch on scraped metrics
  only (`SaturationDetector(count_own_picks=False)`: the same code, one switch).

    .venv/bin/python -m benchmarks.flow_control [--endpoints 4] [--seed 0] [--chart benchmarks/flow_control.png]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks.policies import MODEL, Picker
from benchmarks.virtual_time import capacity
from benchmarks.workloads import Item, prompt_text, sim_request
from epp.config.flowcontrol import FlowControlSpec
from epp.datastore import Freshness
from epp.flowcontrol import FlowController, FlowSettings, Outcome, QueuedRequest
from epp.flowcontrol.gauge import PoolGauge
from epp.flowcontrol.policies import PriorityHoldback, RoundRobinFairness, StaticUsageLimit
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler
from epp.scheduling.saturation import SaturationDetector
from epp.sim.engine import Engine
from epp.sim.profiles import profile_named

_STEP, _ARRIVAL, _SCRAPE, _TIMER = 0, 1, 2, 3
SCRAPE_S = 0.05


@dataclass(slots=True)
class Run:
    ttft: np.ndarray  # from arrival at the picker (queue wait included); NaN: not served
    outcome: list[str]
    served_at: np.ndarray  # dispatch time
    engine_queue_peak: int = 0
    engine_queue: list[tuple[float, int]] = field(default_factory=list)  # (time, Σ waiting) after each change


def simulate(
    items: Sequence[Item],
    priorities: Sequence[int],
    flows: Sequence[str],
    endpoints: int,
    spec: FlowControlSpec,
    settings: FlowSettings | None = None,
    own_picks: bool = True,
    seed: int = 0,
) -> Run:
    profile = profile_named("h100")
    engines = [Engine(profile) for _ in range(endpoints)]
    now = 0.0

    def clock() -> float:
        return now

    scheduler = build_scheduler(None, seed=seed)
    picker = Picker("epp", endpoints, scheduler, clock)
    freshness = Freshness()
    detector = SaturationDetector(scheduler.saturation.thresholds, freshness, count_own_picks=own_picks)
    gauge = PoolGauge(detector, freshness)
    settings = settings or FlowSettings()
    settings.spec = spec
    fc = FlowController(settings)
    n = len(items)
    run = Run(np.full(n, np.nan), ["lost"] * n, np.full(n, np.nan))
    seq = itertools.count()
    heap: list[tuple[float, int, int, int]] = [(items[i].arrival, next(seq), _ARRIVAL, i) for i in range(n)]
    heapq.heapify(heap)
    heapq.heappush(heap, (0.0, next(seq), _SCRAPE, 0))
    timer_at = [np.inf]

    def note_queue() -> None:
        total = sum(e.num_waiting for e in engines)
        run.engine_queue.append((now, total))
        run.engine_queue_peak = max(run.engine_queue_peak, total)

    def dispatch() -> int:
        """One dispatch opportunity (upstream runs one per arrival and per ms; ours per event): returns how many
        requests left the queue unserved (expired)."""
        expired = fc.expire(now)
        for item, outcome in expired:
            run.outcome[int(item.ticket)] = outcome.value  # type: ignore[call-overload]
        snapshot = picker.table.view()
        while fc.count:
            saturation = gauge.saturation(snapshot, snapshot.slots, now)
            item = fc.dispatch(saturation, now)
            if item is None:
                break
            i = int(item.ticket)  # type: ignore[call-overload]
            request = InferenceRequest(str(i), ApiKind.COMPLETIONS, MODEL, prompt=prompt_text(i, items[i]))
            decision = picker.director.decide(request)
            picker._decisions[i] = decision
            s = picker._server_of[decision.slot]
            engine = engines[s]
            engine.submit(sim_request(i, items[i]), now)
            run.outcome[i] = Outcome.DISPATCHED.value
            run.served_at[i] = now
            if not engine.stepping:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, s))
        note_queue()
        expiry = fc.next_expiry()
        if expiry is not None and expiry < timer_at[0]:
            timer_at[0] = expiry
            heapq.heappush(heap, (expiry, next(seq), _TIMER, 0))
        return len(expired)

    remaining = n
    while heap and remaining:
        now, _, kind, arg = heapq.heappop(heap)
        if kind == _STEP:
            engine = engines[arg]
            for fin in engine.end_step(now).finished:
                i = fin.request_id
                run.ttft[i] = fin.first_token_at - items[i].arrival
                picker.done(arg, i)
                remaining -= 1
            if engine.busy:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, arg))
        elif kind == _ARRIVAL:
            item = QueuedRequest(ticket=arg, flow_id=flows[arg], priority=priorities[arg], received_at=now)
            refused = fc.enqueue(item, now)
            if refused is not None:
                run.outcome[arg] = refused.value
                remaining -= 1
        elif kind == _SCRAPE:
            picker.scrape(engines, now)
            if remaining:
                heapq.heappush(heap, (now + SCRAPE_S, next(seq), _SCRAPE, 0))
        else:
            timer_at[0] = np.inf
        remaining -= dispatch()
    return run


def _items(n: int, rate: float, seed: int, prompt: int = 1000, output: int = 200) -> list[Item]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return [Item(float(a), prompt, output) for a in t]


def pool_capacity(endpoints: int, seed: int) -> float:
    return capacity(_items(300, 1.0, seed), profile_named("h100"), seed=seed) * endpoints


def p(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else float("nan")


def priority_overload(endpoints: int, seed: int, n: int) -> dict[str, object]:
    cap = pool_capacity(endpoints, seed)
    spec = FlowControlSpec(default_request_ttl_s=2.0)

    def holdback() -> FlowSettings:  # the same usage limit for both runs
        return FlowSettings(usage_limit=PriorityHoldback(min_ceiling=0.1, max_ceiling=0.2))

    base_items = _items(n // 4, 0.5 * cap, seed)
    prio = [10] * len(base_items)
    base = simulate(base_items, prio, ["c"] * len(base_items), endpoints, spec, holdback(), seed=seed)
    items = _items(n, 1.3 * cap, seed + 1)
    rng = np.random.default_rng(seed)
    critical = rng.random(n) < 0.2
    prios = [10 if c else -1 for c in critical]
    run = simulate(items, prios, ["c" if c else "s" for c in critical], endpoints, spec, holdback(), seed=seed)
    static = simulate(items, prios, ["c" if c else "s" for c in critical], endpoints, spec, seed=seed)
    crit_ttft = run.ttft[critical]
    shed = ~critical
    outcomes = np.array(run.outcome)
    late = [
        i for i in np.flatnonzero(shed) if not np.isnan(run.served_at[i]) and run.served_at[i] - items[i].arrival > 2.0
    ]
    return {
        "capacity_rps": cap,
        "critical_p99_alone_50pct": p(base.ttft, 99),
        "critical_p99_overload": p(crit_ttft, 99),
        "ratio": p(crit_ttft, 99) / p(base.ttft, 99),
        "critical_p99_overload_static_1.0": p(static.ttft[critical], 99),
        "sheddable": int(shed.sum()),
        "sheddable_served": int(np.count_nonzero(outcomes[shed] == "Dispatched")),
        "sheddable_429_ttl": int(np.count_nonzero(outcomes[shed] == "EvictedTTL")),
        "sheddable_429_capacity": int(np.count_nonzero(outcomes[shed] == "RejectedCapacity")),
        "lost": int(np.count_nonzero(outcomes == "lost")),
        "served_after_ttl": len(late),
        "critical_unserved": int(np.count_nonzero(np.isnan(crit_ttft))),
    }


def noisy_neighbour(endpoints: int, seed: int, n: int) -> dict[str, object]:
    cap = pool_capacity(endpoints, seed)
    spec = FlowControlSpec(default_request_ttl_s=0.0)
    heavy, light = 1.2 * cap * 10 / 11, 1.2 * cap / 11
    light_items = _items(n // 11, light, seed + 2)
    solo = simulate(light_items, [0] * len(light_items), ["light"] * len(light_items), endpoints, spec, seed=seed)
    heavy_items = _items(n - len(light_items), heavy, seed + 3)
    tagged = sorted(
        [(it, "light") for it in light_items] + [(it, "heavy") for it in heavy_items], key=lambda x: x[0].arrival
    )
    items = [it for it, _ in tagged]
    flows = [f for _, f in tagged]
    is_light = np.array([f == "light" for f in flows])
    out: dict[str, object] = {"capacity_rps": cap, "light_p90_solo": p(solo.ttft, 90)}
    strict = simulate(items, [0] * len(items), flows, endpoints, spec, seed=seed)
    out["light_p90_global_strict"] = p(strict.ttft[is_light], 90)
    for threshold in (1.0, 0.3, 0.1):  # static-usage-limit-policy threshold
        rr = FlowSettings(fairness=lambda ref: RoundRobinFairness(), usage_limit=StaticUsageLimit(threshold))
        run = simulate(items, [0] * len(items), flows, endpoints, spec, settings=rr, seed=seed)
        out[f"light_p90_round_robin_threshold_{threshold}"] = p(run.ttft[is_light], 90)
        out[f"ratio_threshold_{threshold}"] = p(run.ttft[is_light], 90) / p(solo.ttft, 90)
        out[f"heavy_p90_round_robin_threshold_{threshold}"] = p(run.ttft[~is_light], 90)
    return out


def overshoot(endpoints: int, seed: int, n: int) -> dict[str, object]:
    cap = pool_capacity(endpoints, seed)
    spec = FlowControlSpec(default_request_ttl_s=0.0)
    background = _items(n, 0.6 * cap, seed + 4)
    # What the pool holds at saturation 1.0: the engines' batch plus queueDepthThreshold waiting each.
    holds = endpoints * (profile_named("h100").max_num_seqs + 5)
    t_burst = background[len(background) // 2].arrival
    burst = [Item(t_burst + SCRAPE_S * k / (3 * holds), 1000, 200) for k in range(3 * holds)]
    items = sorted(background + burst, key=lambda it: it.arrival)
    prios = [0] * len(items)
    flows = ["default-flow"] * len(items)
    ours = simulate(items, prios, flows, endpoints, spec, own_picks=True, seed=seed)
    upstream = simulate(items, prios, flows, endpoints, spec, own_picks=False, seed=seed)
    return {
        "burst": len(burst),
        "engine_queue_peak_ours": ours.engine_queue_peak,
        "engine_queue_peak_upstream_style": upstream.engine_queue_peak,
        "ratio": ours.engine_queue_peak / max(1, upstream.engine_queue_peak),
        "p99_ttft_ours": p(ours.ttft, 99),
        "p99_ttft_upstream_style": p(upstream.ttft, 99),
        "_series": (ours.engine_queue, upstream.engine_queue, t_burst),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--chart", default="")
    args = ap.parse_args(argv)
    results = {
        "priority-overload": priority_overload(args.endpoints, args.seed, args.requests),
        "noisy-neighbour": noisy_neighbour(args.endpoints, args.seed, args.requests),
        "overshoot": overshoot(args.endpoints, args.seed, args.requests),
    }
    series = results["overshoot"].pop("_series")
    print(json.dumps(results, indent=2, default=float))
    if args.chart:
        _chart(series, args.chart)
    return 0


def _chart(series: object, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, upstream, t0 = series  # type: ignore[misc]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for data, label in ((upstream, "upstream-style (scraped metrics only)"), (ours, "epp (scraped + own picks)")):
        t = np.array([x for x, _ in data]) - t0
        q = np.array([y for _, y in data])
        keep = (t > -2) & (t < 40)
        ax.step(t[keep], q[keep], where="post", label=label)
    ax.set_xlabel("seconds from the burst")
    ax.set_ylabel("model servers' queue (Σ waiting)")
    ax.set_title("Overshoot: a 3× burst within one scrape interval")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
