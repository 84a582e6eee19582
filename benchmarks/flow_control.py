"""Flow control in virtual time: the real queues (`epp.flowcontrol`), the real director and scheduler over a real
endpoint table fed by simulated scrapes, and the simulator's engine model — no clock, deterministic per seed.

Every workload runs with one configuration, the one docs/flow-control.md recommends
(`benchmarks/configs/flow-control-self-calibrating.yaml`, built by the same code as `epp serve --config-file`;
`--config benchmarks/configs/flow-control.yaml`: the threshold one), and, to compare,
with upstream's defaults (the gate on, nothing else set: utilization-detector queueDepthThreshold 5,
static-usage-limit 1.0, global-strict fairness; for the noisy neighbour also with round-robin fairness alone). Only
each workload's TTL is its own.

Workloads (benchmarks/RESULTS.md, "Flow control"):
- `priority-overload`: 130 % of the pool's capacity, 20 % critical (priority 10) / 80 % sheddable (priority −1),
  TTL 2 s; critical p99 TTFT compared with critical traffic alone at 50 % under the same configuration.
- `noisy-neighbour`: two fairness ids in one band, one sending 10× the other, 120 % of capacity; the light flow's
  p90 TTFT compared with the light flow alone. Also: the pool's served req/s with flow control and without (every
  request sent on at arrival), and the light flow's time from dispatch to first token alone (its TTFT had it
  never waited in the picker: what no fairness policy can beat). And the fair-share gate's curve: the light flow's
  ratio and the pool's served req/s with the configuration's round-robin-fairness-policy at each
  `overShareCeiling` of `SHARE_CURVE` (the gate's cost in throughput). `--oracle-placement`: also that curve with
  the light flow's requests placed by the oracle (`benchmarks.policies.Oracle`: every engine's true queue and
  prefill work, the lowest predicted TTFT; the pick is the director's, narrowed to that endpoint, so the endpoint
  table's books stay true): what placement alone could add.
- `overshoot`: a burst of 3× what the pool holds at saturation 1.0, arriving within one scrape interval, on a
  pool at 60 % load; the engines' own queue peak with our gating vs upstream-style dispatch on scraped metrics
  only (`SaturationDetector(count_own_picks=False)`: the same configuration, one switch).

    .venv/bin/python -m benchmarks.flow_control [--endpoints 4] [--seed 0] [--requests 4000] \
        [--config benchmarks/configs/flow-control-self-calibrating.yaml] [--chart benchmarks/flow_control.png]

`--config benchmarks/configs/flow-control-fair-share.yaml`: the option that meets the noisy neighbour's bound
(the fair-share gate at overShareCeiling 0.58), every workload and bound in the same run.

`--seeds 0-9`: the three workloads of `--config` alone (no upstream defaults, no fair-share curve) at each seed,
each seed's figures and their mean, standard deviation, min and max: one seed's figures differ from another's by
more than two configurations do, so a comparison is read against this spread.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import numpy as np

from benchmarks.policies import MODEL, Oracle, Picker
from benchmarks.virtual_time import capacity
from benchmarks.workloads import Item, prompt_text, sim_request
from epp.app.config_file import load_config
from epp.config.model import EndpointPickerConfig
from epp.flowcontrol import FlowController, FlowSettings, Outcome, QueuedRequest
from epp.flowcontrol.gauge import PoolGauge
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler, build_scheduler
from epp.scheduling.knee import KneeDetector
from epp.scheduling.saturation import SaturationDetector
from epp.sim.engine import Engine
from epp.sim.profiles import EngineProfile, profile_named

_STEP, _ARRIVAL, _SCRAPE, _TIMER = 0, 1, 2, 3
SCRAPE_S = 0.05
RECOMMENDED = Path(__file__).parent / "configs" / "flow-control-self-calibrating.yaml"
THRESHOLD = Path(__file__).parent / "configs" / "flow-control.yaml"  # queueDepthThreshold 1, for a measured pool
SHARE_CURVE = (1.0, 0.75, 0.65, 0.6, 0.58, 0.5)  # round-robin-fairness-policy overShareCeiling (1.0: no gate)


PoolDetector = SaturationDetector | KneeDetector


@dataclass(frozen=True, slots=True)
class Setup:
    """A flow-control configuration to run: a config file's, or upstream's defaults (`config` None)."""

    name: str
    config: EndpointPickerConfig | None = None

    def build(self, seed: int, ttl_s: float) -> tuple[Scheduler, FlowSettings, PoolDetector]:
        """The scheduler, the queues' settings (the workload's TTL) and the pool's detector, as `epp serve`."""
        scheduler = build_scheduler(self.config, seed=seed, allow_experimental=True)
        settings = scheduler.flow or FlowSettings()
        settings = replace(settings, spec=replace(settings.spec, default_request_ttl_s=ttl_s))
        detector = scheduler.saturation
        if not isinstance(detector, SaturationDetector | KneeDetector):
            raise SystemExit(f"{self.name}: the benchmark needs utilization- or self-calibrating-detector")
        return scheduler, settings, detector


UPSTREAM_DEFAULTS = Setup("upstream defaults")
# Upstream's defaults with round-robin fairness only: what queueDepthThreshold 1 adds, in the noisy neighbour.
DEFAULTS_ROUND_ROBIN = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- {type: utilization-detector}
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: prefix-cache-scorer}
- {type: inflight-load-scorer}
- {type: max-score-picker}
- {type: round-robin-fairness-policy}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: utilization-detector}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: inflight-load-scorer, weight: 2}
  - {pluginRef: max-score-picker}
flowControl: {defaultPriorityBand: {fairnessPolicyRef: round-robin-fairness-policy}}
"""


@dataclass(slots=True)
class Run:
    ttft: np.ndarray  # from arrival at the picker (queue wait included); NaN: not served
    outcome: list[str]
    served_at: np.ndarray  # dispatch time
    finished_at: np.ndarray  # last token; NaN: not served
    engine_queue_peak: int = 0
    engine_queue: list[tuple[float, int]] = field(default_factory=list)  # (time, Σ waiting) after each change

    def served_rps(self, items: Sequence[Item]) -> float:
        """Requests served per second, from the first arrival to the last completion."""
        done = ~np.isnan(self.finished_at)
        return float(done.sum() / (np.nanmax(self.finished_at) - items[0].arrival)) if done.any() else 0.0


def simulate(
    items: Sequence[Item],
    priorities: Sequence[int],
    flows: Sequence[str],
    endpoints: int | Sequence[EngineProfile],
    setup: Setup,
    ttl_s: float,
    own_picks: bool = True,
    gated: bool = True,
    seed: int = 0,
    oracle_flows: frozenset[str] = frozenset(),
    stale: frozenset[int] = frozenset(),
    stale_after: float = np.inf,
    slos: np.ndarray | None = None,
) -> Run:
    """One run. `endpoints`: that many reference servers (H100), or the pool's profiles; `own_picks=False`:
    upstream-style dispatch on scraped metrics only (with a config whose detector has no thresholds, upstream's
    default utilization-detector); `gated=False`: no flow control, every request is sent on at arrival (the engines
    queue it); `oracle_flows`: those flows' requests go where the oracle's predicted TTFT is lowest; `stale`: these
    servers' scrapes stop at `stale_after` (their data goes stale while they keep serving); `slos`: each request's
    TTFT objective in seconds (`x-llm-d-slo-ttft-ms`: the queue's deadline ordering and the SLO plugins read it)."""
    profiles = [profile_named("h100")] * endpoints if isinstance(endpoints, int) else list(endpoints)
    engines = [Engine(profile) for profile in profiles]
    now = 0.0

    def clock() -> float:
        return now

    scheduler, settings, pool_detector = setup.build(seed, ttl_s)
    picker = Picker("epp", len(engines), scheduler, clock)
    oracle = Oracle(engines, seed)
    addresses = picker.table.view().addresses
    freshness = pool_detector.freshness
    detector: PoolDetector = pool_detector
    if isinstance(pool_detector, SaturationDetector):
        detector = SaturationDetector(pool_detector.thresholds, freshness, count_own_picks=own_picks)
    elif not own_picks:
        detector = SaturationDetector(freshness=freshness, count_own_picks=False)
    gauge = PoolGauge(detector, freshness)
    fc = FlowController(settings)
    n = len(items)
    run = Run(np.full(n, np.nan), ["lost"] * n, np.full(n, np.nan), np.full(n, np.nan))
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
        for gone, outcome in expired:
            run.outcome[int(gone.ticket)] = outcome.value  # type: ignore[call-overload]
        snapshot = picker.table.view()
        while fc.count:
            saturation = gauge.saturation(snapshot, snapshot.slots, now) if gated else 0.0
            item = fc.dispatch(saturation, now)
            if item is None:
                break
            i = int(item.ticket)  # type: ignore[call-overload]
            slo = float(slos[i]) * 1e3 if slos is not None else None
            request = InferenceRequest(
                str(i), ApiKind.COMPLETIONS, MODEL, prompt=prompt_text(i, items[i]), slo_ttft_ms=slo
            )
            subset = None
            if flows[i] in oracle_flows:
                best = oracle.pick(i, items[i], sim_request(i, items[i]), now)
                subset = [addresses[picker.slots[best]]]
            decision = picker.director.decide(request, subset)
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
            stepped = engine.end_step(now)
            for i in stepped.first_tokens:  # the stream's first response byte: the feed learns the TTFT now
                picker.first_token(arg, i, now - float(run.served_at[i]))
            for fin in stepped.finished:
                i = fin.request_id
                run.ttft[i] = fin.first_token_at - items[i].arrival
                run.finished_at[i] = fin.finished_at
                picker.done(arg, i, fin)
                remaining -= 1
            if engine.busy:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, arg))
        elif kind == _ARRIVAL:
            slo_s = float(slos[arg]) if slos is not None else None
            item = QueuedRequest(
                ticket=arg, flow_id=flows[arg], priority=priorities[arg], received_at=now, slo_ttft_s=slo_s
            )
            refused = fc.enqueue(item, now)
            if refused is not None:
                run.outcome[arg] = refused.value
                remaining -= 1
        elif kind == _SCRAPE:
            picker.scrape(engines, now, skip=stale if now >= stale_after else frozenset())
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


def priority_overload(setup: Setup, endpoints: int, seed: int, n: int) -> dict[str, object]:
    cap = pool_capacity(endpoints, seed)
    ttl = 2.0
    base_items = _items(n // 4, 0.5 * cap, seed)
    prio = [10] * len(base_items)
    base = simulate(base_items, prio, ["c"] * len(base_items), endpoints, setup, ttl, seed=seed)
    items = _items(n, 1.3 * cap, seed + 1)
    rng = np.random.default_rng(seed)
    critical = rng.random(n) < 0.2
    prios = [10 if c else -1 for c in critical]
    run = simulate(items, prios, ["c" if c else "s" for c in critical], endpoints, setup, ttl, seed=seed)
    crit_ttft = run.ttft[critical]
    shed = ~critical
    outcomes = np.array(run.outcome)
    late = [
        i for i in np.flatnonzero(shed) if not np.isnan(run.served_at[i]) and run.served_at[i] - items[i].arrival > ttl
    ]
    return {
        "critical_p99_alone_50pct": p(base.ttft, 99),
        "critical_p99_overload": p(crit_ttft, 99),
        "ratio": p(crit_ttft, 99) / p(base.ttft, 99),
        "sheddable": int(shed.sum()),
        "sheddable_served": int(np.count_nonzero(outcomes[shed] == "Dispatched")),
        "sheddable_429_ttl": int(np.count_nonzero(outcomes[shed] == "EvictedTTL")),
        "sheddable_429_capacity": int(np.count_nonzero(outcomes[shed] == "RejectedCapacity")),
        "lost": int(np.count_nonzero(outcomes == "lost")),
        "served_after_ttl": len(late),
        "critical_unserved": int(np.count_nonzero(np.isnan(crit_ttft))),
        "served_rps": run.served_rps(items),
    }


def noisy_neighbour(
    setup: Setup, endpoints: int, seed: int, n: int, extras: bool = False, oracle: bool = False
) -> dict[str, object]:
    """`extras`: also the pool without flow control (every request sent on at arrival); `oracle`: the light flow's
    requests placed by the oracle (in the solo run too)."""
    placed = frozenset({"light"}) if oracle else frozenset()
    cap = pool_capacity(endpoints, seed)
    heavy, light = 1.2 * cap * 10 / 11, 1.2 * cap / 11
    light_items = _items(n // 11, light, seed + 2)
    solo = simulate(
        light_items,
        [0] * len(light_items),
        ["light"] * len(light_items),
        endpoints,
        setup,
        0.0,
        seed=seed,
        oracle_flows=placed,
    )
    heavy_items = _items(n - len(light_items), heavy, seed + 3)
    tagged = sorted(
        [(it, "light") for it in light_items] + [(it, "heavy") for it in heavy_items], key=lambda x: x[0].arrival
    )
    items = [it for it, _ in tagged]
    flows = [f for _, f in tagged]
    is_light = np.array([f == "light" for f in flows])
    run = simulate(items, [0] * len(items), flows, endpoints, setup, 0.0, seed=seed, oracle_flows=placed)
    solo_p90, light_p90 = p(solo.ttft, 90), p(run.ttft[is_light], 90)
    arrival = np.array([it.arrival for it in items])
    out: dict[str, object] = {
        "light_p90_solo": solo_p90,
        "light_p90": light_p90,
        "ratio": light_p90 / solo_p90,
        "light_p90_picker_wait": p((run.served_at - arrival)[is_light], 90),
        # from dispatch to first token: what the light flow's TTFT would be if it never waited in the picker
        "light_p90_engine_side": p((run.ttft - (run.served_at - arrival))[is_light], 90),
        "heavy_p90": p(run.ttft[~is_light], 90),
        "engine_queue_mean": _time_mean(run.engine_queue),
        "served_rps": run.served_rps(items),
    }
    if extras:
        ungated = simulate(items, [0] * len(items), flows, endpoints, setup, 0.0, gated=False, seed=seed)
        out["served_rps_without_flow_control"] = ungated.served_rps(items)
        out["light_p90_without_flow_control"] = p(ungated.ttft[is_light], 90)
    return out


def with_over_share(config: EndpointPickerConfig, over_share: float) -> EndpointPickerConfig:
    """The configuration with every round-robin-fairness-policy plugin's `overShareCeiling` set."""
    if not any(spec.type == "round-robin-fairness-policy" for spec in config.plugins):
        raise SystemExit("the fair-share curve needs a round-robin-fairness-policy plugin in the configuration")
    plugins = tuple(
        replace(spec, parameters={**spec.parameters, "overShareCeiling": over_share})
        if spec.type == "round-robin-fairness-policy"
        else spec
        for spec in config.plugins
    )
    return replace(config, plugins=plugins)


def share_curve(
    config: EndpointPickerConfig,
    endpoints: int,
    seed: int,
    n: int,
    settings: Sequence[float] = SHARE_CURVE,
    oracle: bool = False,
) -> list[dict[str, float]]:
    """The noisy neighbour at each setting of the fair-share gate: light ratio vs served req/s."""
    out = []
    for c in settings:
        setup = Setup(f"overShareCeiling {c}", with_over_share(config, c))
        r = noisy_neighbour(setup, endpoints, seed, n, oracle=oracle)
        keys = ("ratio", "light_p90", "light_p90_engine_side", "served_rps")
        out.append({"overShareCeiling": c, **{k: float(r[k]) for k in keys}})  # type: ignore[arg-type]
    return out


def _time_mean(series: list[tuple[float, int]]) -> float:
    """Time-weighted mean of a step series (the engines' Σ waiting)."""
    if len(series) < 2:
        return 0.0
    t = np.array([x for x, _ in series])
    v = np.array([y for _, y in series], dtype=float)
    dt = np.diff(t)
    return float((v[:-1] * dt).sum() / dt.sum()) if dt.sum() > 0 else 0.0


def overshoot(setup: Setup, endpoints: int, seed: int, n: int) -> dict[str, object]:
    cap = pool_capacity(endpoints, seed)
    background = _items(n, 0.6 * cap, seed + 4)
    # What the pool holds at saturation 1.0: the engines' batch plus queueDepthThreshold waiting each.
    detector = setup.build(seed, 0.0)[2]
    queue_depth = detector.thresholds.queue_depth if isinstance(detector, SaturationDetector) else 1.0
    holds = endpoints * (profile_named("h100").max_num_seqs + int(queue_depth))
    t_burst = background[len(background) // 2].arrival
    burst = [Item(t_burst + SCRAPE_S * k / (3 * holds), 1000, 200) for k in range(3 * holds)]
    items = sorted(background + burst, key=lambda it: it.arrival)
    prios = [0] * len(items)
    flows = ["default-flow"] * len(items)
    ours = simulate(items, prios, flows, endpoints, setup, 0.0, own_picks=True, seed=seed)
    upstream = simulate(items, prios, flows, endpoints, setup, 0.0, own_picks=False, seed=seed)
    return {
        "burst": len(burst),
        "engine_queue_peak_ours": ours.engine_queue_peak,
        "engine_queue_peak_upstream_style": upstream.engine_queue_peak,
        "ratio": ours.engine_queue_peak / max(1, upstream.engine_queue_peak),
        "p99_ttft_ours": p(ours.ttft, 99),
        "p99_ttft_upstream_style": p(upstream.ttft, 99),
        "_series": (ours.engine_queue, upstream.engine_queue, t_burst),
    }


_Series = tuple[list[tuple[float, int]], list[tuple[float, int]], float]  # ours, upstream-style, burst time
BOUNDS = {"priority-overload": 1.2, "noisy-neighbour": 1.5, "overshoot": 0.5}


def verdict(results: dict[str, dict[str, object]]) -> dict[str, bool]:
    """Each workload's bound, on one configuration's results."""
    po, nn, ov = results["priority-overload"], results["noisy-neighbour"], results["overshoot"]
    return {
        "priority-overload": float(po["ratio"]) <= BOUNDS["priority-overload"]  # type: ignore[arg-type]
        and po["lost"] == 0
        and po["served_after_ttl"] == 0
        and po["critical_unserved"] == 0,
        "noisy-neighbour": float(nn["ratio"]) <= BOUNDS["noisy-neighbour"],  # type: ignore[arg-type]
        "overshoot": float(ov["ratio"]) <= BOUNDS["overshoot"],  # type: ignore[arg-type]
    }


SEED_FIGURES = {  # per seed: workload, figure
    "priority overload ratio": ("priority-overload", "ratio"),
    "priority overload sheddable served": ("priority-overload", "sheddable_served"),
    "noisy neighbour ratio": ("noisy-neighbour", "ratio"),
    "noisy neighbour served req/s": ("noisy-neighbour", "served_rps"),
    "overshoot ratio": ("overshoot", "ratio"),
    "overshoot engine queue peak": ("overshoot", "engine_queue_peak_ours"),
}


def parse_seeds(text: str) -> list[int]:
    """`0-4` or `0,2,5` (or both: `0-2,7`)."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def over_seeds(setup: Setup, endpoints: int, seeds: Sequence[int], n: int) -> dict[str, object]:
    """The three workloads at each seed, and each figure's spread across them."""
    per_seed: dict[str, dict[str, float]] = {}
    for seed in seeds:
        one = {
            "priority-overload": priority_overload(setup, endpoints, seed, n),
            "noisy-neighbour": noisy_neighbour(setup, endpoints, seed, n),
            "overshoot": overshoot(setup, endpoints, seed, n),
        }
        per_seed[str(seed)] = {k: float(one[w][f]) for k, (w, f) in SEED_FIGURES.items()}  # type: ignore[arg-type]
    spread = {}
    for k in SEED_FIGURES:
        v = np.array([fig[k] for fig in per_seed.values()])
        sd = float(v.std(ddof=1)) if v.size > 1 else 0.0
        spread[k] = {"mean": float(v.mean()), "sd": sd, "min": float(v.min()), "max": float(v.max())}
    return {"config": setup.name, "seeds": list(seeds), "per_seed": per_seed, "spread": spread}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default="", help="e.g. 0-9: the config's three workloads at each seed, and the spread")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--config", type=Path, default=RECOMMENDED, help="the flow-control configuration to measure")
    ap.add_argument("--chart", default="")
    ap.add_argument("--oracle-placement", action="store_true", help="also the light flow placed by the oracle")
    args = ap.parse_args(argv)
    setups = [Setup(str(args.config), load_config(args.config, allow_experimental=True, warn=False)), UPSTREAM_DEFAULTS]
    e, s, n = args.endpoints, args.seed, args.requests
    if args.seeds:
        print(json.dumps(over_seeds(setups[0], e, parse_seeds(args.seeds), n), indent=2))
        return 0
    results: dict[str, object] = {"capacity_rps": pool_capacity(e, s)}
    series = {}
    for i, setup in enumerate(setups):
        one: dict[str, dict[str, object]] = {
            "priority-overload": priority_overload(setup, e, s, n),
            "noisy-neighbour": noisy_neighbour(setup, e, s, n, extras=i == 0),
            "overshoot": overshoot(setup, e, s, n),
        }
        series[setup.name] = one["overshoot"].pop("_series")
        results[setup.name] = {**one, "bounds_met": verdict(one)}
    rr = Setup("upstream defaults + round-robin", load_config(None, text=DEFAULTS_ROUND_ROBIN, warn=False))
    results[rr.name] = {"noisy-neighbour": noisy_neighbour(rr, e, s, n)}
    config = cast(EndpointPickerConfig, setups[0].config)
    results["fair-share gate (noisy neighbour)"] = share_curve(config, e, s, n)
    if args.oracle_placement:
        results["fair-share gate, light flow placed by the oracle"] = share_curve(config, e, s, n, (1.0, 0.75), True)
    print(json.dumps(results, indent=2, default=float))
    if args.chart:
        _chart(results, series, setups, args.chart)
    return 0


def _chart(results: dict[str, object], series: dict[str, object], setups: Sequence[Setup], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    ours, upstream, t0 = cast(_Series, series[setups[0].name])
    for data, label in ((upstream, "upstream-style (scraped metrics only)"), (ours, "epp (scraped + own picks)")):
        t = np.array([x for x, _ in data]) - t0
        q = np.array([y for _, y in data])
        keep = (t > -2) & (t < 40)
        left.step(t[keep], q[keep], where="post", label=label)
    left.set_xlabel("seconds from the burst")
    left.set_ylabel("model servers' queue (Σ waiting)")
    left.set_title("Overshoot: a 3× burst within one scrape interval")
    left.legend()
    rec = results[setups[0].name]["noisy-neighbour"]  # type: ignore[index]
    dflt = results[setups[-1].name]["noisy-neighbour"]  # type: ignore[index]
    rr = results["upstream defaults + round-robin"]["noisy-neighbour"]  # type: ignore[index]
    labels = ["upstream\ndefaults", "defaults +\nround-robin", "recommended", "recommended:\nengine side"]
    ratios = [dflt["ratio"], rr["ratio"], rec["ratio"], rec["light_p90_engine_side"] / rec["light_p90_solo"]]
    right.bar(labels, ratios, color=["tab:blue", "tab:cyan", "tab:orange", "tab:gray"])
    right.set_yscale("log")
    right.axhline(BOUNDS["noisy-neighbour"], color="k", linestyle="--", linewidth=1, label="bound 1.5×")
    for x, r in enumerate(ratios):
        right.text(x, r, f"{r:.1f}×", ha="center", va="bottom")
    right.set_ylabel("light flow p90 TTFT / solo p90")
    right.set_title("Noisy neighbour at 120 %: the light flow")
    right.tick_params(axis="x", labelsize=8)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
