"""Saturation that calibrates itself, in virtual time: one flow-control configuration over pools of different engines.

The same harness as `benchmarks.flow_control` (the real queues, director and scheduler over an endpoint table fed
by simulated scrapes; the simulator's engine model), over pools of 1, 4 and 16 endpoints whose engines differ:
H100 and L4 profiles with max-num-seqs from 32 to 600 (`epp.sim.profiles`, `h100-s600` = the H100 profile with
that batch cap), so that no single threshold suits every pool. Each pool runs:

- `overload`: 130 % of the pool's capacity, 20 % critical (priority 10) / 80 % sheddable (−1), TTL 2 s; the
  critical p99 TTFT over its p99 with critical traffic alone at 50 % (bound ≤ 1.2×), each after the first tenth
  of its arrivals (a fresh picker learning its knees: `WARMUP`, the same for every configuration);
- `one stale`: the same, the first endpoint's scrapes stopping after a quarter of the arrivals (it keeps serving);
- `all stale`: the same, every endpoint's scrapes stopping then: requests must still be dispatched (no freeze);
- `overshoot`: a burst of 3× what the pool's engines hold (their batches, capped by KV) within one scrape
  interval on 60 % load; the engines' queue peak over upstream-style dispatch's (scraped metrics only, upstream's
  default utilization-detector), bound ≤ 0.5×.

Configurations, side by side: `benchmarks/configs/flow-control-self-calibrating.yaml` (self-calibrating-detector:
no number to tune) and, to compare, the threshold configuration (`benchmarks/configs/flow-control.yaml`:
utilization-detector queueDepthThreshold 1, measured on four H100s).

    .venv/bin/python -m benchmarks.calibration [--requests 2000] [--seed 0] [--pools all] [--json F]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.flow_control import RECOMMENDED, SCRAPE_S, THRESHOLD, Setup, _items, p, simulate
from benchmarks.virtual_time import capacity
from benchmarks.workloads import Item
from epp.app.config_file import load_config
from epp.sim.profiles import EngineProfile, profile_named

SELF_CALIBRATING = RECOMMENDED  # benchmarks/configs/flow-control-self-calibrating.yaml, the recommended one
_CAPS = ("h100-s32", "h100-s128", "h100", "h100-s600")  # max-num-seqs 32, 128, 256, 600
POOLS: dict[str, tuple[str, ...]] = {
    "1 × h100-s32": ("h100-s32",),
    "1 × h100-s600": ("h100-s600",),
    "1 × l4": ("l4",),
    "4 × h100 s32…s600": _CAPS,
    "16 × h100 s32…s600": _CAPS * 4,
    "4 × h100 + l4": ("h100-s32", "h100", "h100-s600", "l4"),  # a slow engine beside fast ones: see RESULTS.md
}
BOUNDS = {"overload": 1.2, "overshoot": 0.5}
PROMPT, OUTPUT, TTL_S = 1000, 200, 2.0
WARMUP = 0.1  # the first tenth of each run's arrivals (a fresh picker learning its knees) is left out of p99


def pool_capacity(pool: Sequence[EngineProfile], seed: int) -> float:
    sample = _items(300, 1.0, seed, PROMPT, OUTPUT)
    per = {prof.name: capacity(sample, prof, seed=seed) for prof in set(pool)}
    return sum(per[prof.name] for prof in pool)


def overload(setup: Setup, pool: Sequence[EngineProfile], cap: float, seed: int, n: int) -> dict[str, object]:
    """Critical alone at 50 %, then 130 % mixed: fresh, one endpoint stale, every endpoint stale."""
    base_items = _items(n // 4, 0.5 * cap, seed)
    base = simulate(base_items, [10] * len(base_items), ["c"] * len(base_items), pool, setup, TTL_S, seed=seed)
    base_p99 = p(base.ttft[int(WARMUP * len(base_items)) :], 99)
    items = _items(n, 1.3 * cap, seed + 1)
    critical = np.random.default_rng(seed).random(n) < 0.2
    prios = [10 if c else -1 for c in critical]
    flows = ["c" if c else "s" for c in critical]
    stale_after = items[n // 4].arrival
    arrival = np.array([it.arrival for it in items])
    out: dict[str, object] = {"critical_p99_alone_50pct": base_p99}
    for name, stale in (
        ("fresh", frozenset()),
        ("one stale", frozenset({0})),
        ("all stale", frozenset(range(len(pool)))),
    ):
        run = simulate(items, prios, flows, pool, setup, TTL_S, seed=seed, stale=stale, stale_after=stale_after)
        crit = run.ttft[critical & (np.arange(n) >= int(WARMUP * n))]
        late = arrival >= stale_after
        out[name] = {
            "critical_p99": p(crit, 99),
            "ratio": p(crit, 99) / base_p99,
            "critical_unserved": int(np.isnan(run.ttft[critical]).sum()),
            "dispatched_after_stale": int(np.count_nonzero(~np.isnan(run.served_at[late]))),
            "arrived_after_stale": int(late.sum()),
            "sheddable_served": int(np.count_nonzero(~np.isnan(run.served_at[~critical]))),
            "served_rps": run.served_rps(items),
        }
    return out


def overshoot(setup: Setup, pool: Sequence[EngineProfile], cap: float, seed: int, n: int) -> dict[str, object]:
    background = _items(n, 0.6 * cap, seed + 4)
    holds = sum(min(prof.max_num_seqs, prof.kv_tokens // (PROMPT + OUTPUT)) + 1 for prof in pool)
    t_burst = background[len(background) // 2].arrival
    burst = [Item(t_burst + SCRAPE_S * k / (3 * holds), PROMPT, OUTPUT) for k in range(3 * holds)]
    items = sorted(background + burst, key=lambda it: it.arrival)
    prios, flows = [0] * len(items), ["default-flow"] * len(items)
    ours = simulate(items, prios, flows, pool, setup, 0.0, seed=seed)
    upstream = simulate(items, prios, flows, pool, setup, 0.0, own_picks=False, seed=seed)
    return {
        "burst": len(burst),
        "engine_queue_peak": ours.engine_queue_peak,
        "engine_queue_peak_upstream_style": upstream.engine_queue_peak,
        "ratio": ours.engine_queue_peak / max(1, upstream.engine_queue_peak),
        "p99_ttft": p(ours.ttft, 99),
        "p99_ttft_upstream_style": p(upstream.ttft, 99),
    }


def verdict(result: dict[str, dict[str, object]]) -> dict[str, bool]:
    ov, sh = result["overload"], result["overshoot"]
    met = {
        f"overload {k} ≤ {BOUNDS['overload']}×": float(ov[k]["ratio"]) <= BOUNDS["overload"]  # type: ignore[index]
        and ov[k]["critical_unserved"] == 0  # type: ignore[index]
        for k in ("fresh", "one stale", "all stale")
    }
    met["no freeze (dispatched after the data went stale)"] = all(
        int(ov[k]["dispatched_after_stale"]) > 0  # type: ignore[index]
        for k in ("one stale", "all stale")
    )
    met[f"overshoot ≤ {BOUNDS['overshoot']}×"] = float(sh["ratio"]) <= BOUNDS["overshoot"]  # type: ignore[arg-type]
    return met


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pools", default="all", help=f"comma list of: {', '.join(POOLS)}; or all")
    ap.add_argument("--threshold-config", action="store_true", help="also the queueDepthThreshold 1 configuration")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    names = list(POOLS) if args.pools == "all" else [x.strip() for x in args.pools.split(",")]
    configs = [SELF_CALIBRATING] + ([THRESHOLD] if args.threshold_config else [])
    setups = [Setup(c.name, load_config(c, allow_experimental=True, warn=False)) for c in configs]
    results: dict[str, object] = {}
    for name in names:
        pool = [profile_named(x) for x in POOLS[name]]
        cap = pool_capacity(pool, args.seed)
        per: dict[str, object] = {"capacity_rps": cap}
        for setup in setups:
            one = {
                "overload": overload(setup, pool, cap, args.seed, args.requests),
                "overshoot": overshoot(setup, pool, cap, args.seed, args.requests),
            }
            per[setup.name] = {**one, "bounds_met": verdict(one)}
            print(f"# {name} ({cap:.1f} req/s) {setup.name}: {json.dumps(per[setup.name], default=float)}", flush=True)
        results[name] = per
    print(json.dumps(results, indent=2, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
