"""SLO attainment in virtual time: the picker's SLO-aware profile (upstream's predicted-latency types on the
picker's own online latency model) against the default profile and an oracle that knows each request's TTFT.

    python -m benchmarks.slo --load 0.8,1.1 --requests 2000

Each request carries a TTFT objective drawn per request (`x-llm-d-slo-ttft-ms`). By default two classes, as a
pool serving chat and batch traffic sees them: half interactive (0.15 s), half batch (10 s), each at least twice
the request's own unloaded TTFT on the fastest profile; `--objectives relative` draws multiples of the request's
unloaded TTFT instead (the earlier workload, narrow spread). Attainment is the share of all requests whose TTFT met
their own objective (a shed request counts as missed, and the shed are reported beside it), also per class. The
pool mixes engine profiles (`--profiles`, cycled; by default 2 H100s and 26 L4s, each half of the capacity), so
where a request goes decides whether its objective can be met at all: an L4 prefills a median prompt in ~0.4 s.
Same code path as benchmarks/quality.py: the real Director and scheduler over simulated scrapes; the learner is fed
by the observation feed as on the serving path: each TTFT at its first token (`Policy.first_token` →
`Director.first_byte`), the rest at the end (`Policy.done` → `Director.complete` with the engine's timing).
`slo-tiers-queued` puts the picker's own flow-control queue in front of `slo-tiers` (benchmarks.flow_control's
harness: the real queues and gauge), ordered by `slo-deadline-ordering-policy` and gated by
`self-calibrating-detector`; its TTFT counts from arrival (the wait in the picker's queue included), and its row
gives that wait (the others: none).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from benchmarks.flow_control import Setup
from benchmarks.flow_control import simulate as fc_simulate
from benchmarks.policies import MODEL, Oracle, Picker
from benchmarks.virtual_time import capacity, simulate
from benchmarks.workloads import Item, load, prompt_text, scaled_arrivals
from epp.config.decode import parse_config
from epp.datastore.objectives import ObjectiveStore
from epp.director import Director
from epp.errors import EppError, ErrorCode
from epp.flowcontrol import Outcome
from epp.flowcontrol.types import DEFAULT_FLOW
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler, build_scheduler
from epp.sim.engine import Engine, SimRequest
from epp.sim.profiles import EngineProfile, profile_named

TIERS = ((0.3, 2.0), (0.4, 5.0), (0.3, 20.0))  # --objectives relative: (share, multiple of the unloaded TTFT)


def slo_config(
    latency_weight: float = 2.0,
    strategy: str = "least",
    buffer: float = 1.0,
    speed_tiers: bool = False,
    admitter: bool = False,
    flow_control: bool = False,
) -> dict[str, object]:
    """Our built-in profile with upstream's SLO plugins added (as upstream's predicted-latency sample adds them):
    the prefix match from an approximate producer that both the prefix scorer and the latency producer read (its
    uncached tokens), the headroom tier filter before the scorers, and the latency scorer beside the load and
    prefix scorers. `flow_control`: the picker's own queue in front of it (feature gate `flowControl`), ordered by
    `slo-deadline-ordering-policy` (received + the request's TTFT objective: interactive requests first), held
    while `self-calibrating-detector` reads the pool saturated (no number to tune)."""
    prefix = {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"}
    scorers = [
        ("queue-scorer", 2.0, {}),
        ("kv-cache-utilization-scorer", 2.0, {}),
        ("prefix-cache-scorer", 3.0, prefix),
        ("inflight-load-scorer", 2.0, {}),
        ("latency-scorer", latency_weight, {"headroomSelectionStrategy": strategy}),
    ]
    plugins: list[dict[str, object]] = [
        {"type": "approx-prefix-cache-producer", "parameters": {"blockSize": 64}},
        {"type": "predicted-latency-producer", "parameters": {"streamingMode": True, "sloBufferFactor": buffer}},
        {"type": "slo-headroom-tier-filter", "parameters": {"speedTiers": speed_tiers}},
        *({"type": t, "parameters": p} for t, _, p in scorers),
        {"type": "max-score-picker"},
        *([{"type": "latency-slo-admitter"}] if admitter else []),
    ]
    refs: list[dict[str, object]] = [
        {"pluginRef": "approx-prefix-cache-producer"},
        {"pluginRef": "predicted-latency-producer"},
        {"pluginRef": "slo-headroom-tier-filter"},
        *({"pluginRef": t, "weight": w} for t, w, _ in scorers if w > 0),
        {"pluginRef": "max-score-picker"},
    ]
    doc: dict[str, object] = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": refs}],
    }
    if flow_control:
        band = {"fairnessPolicyRef": "global-strict-fairness-policy", "orderingPolicyRef": DEADLINE_ORDERING}
        plugins += [
            {"type": "self-calibrating-detector"},
            {"type": "global-strict-fairness-policy"},
            {"type": DEADLINE_ORDERING},
        ]
        doc["featureGates"] = ["flowControl"]
        doc["flowControl"] = {
            "defaultPriorityBand": band,
            "defaultNegativePriorityBand": band,
            "saturationDetector": {"pluginRef": "self-calibrating-detector"},
        }
    return doc


SHEDDABLE = "sheddable"  # the objective (priority -1) a sheddable request names
DEADLINE_ORDERING = "slo-deadline-ordering-policy"
QUEUE_TTL_S = 60.0  # flow control's queue-wait budget (its default): a request still queued then is shed


class SloPicker(Picker):
    """The picker with each request's TTFT objective on it (the header the parser reads) and, for the sheddable
    ones, an objective of priority -1 (`x-llm-d-inference-objective`): the director sheds those as `epp serve`
    does (the config's admitters, then the saturation detector); a shed request's pick is -1."""

    def __init__(
        self, name: str, n: int, scheduler: Scheduler, clock: Callable[[], float], slos: np.ndarray, shed: np.ndarray
    ) -> None:
        super().__init__(name, n, scheduler, clock)
        store = ObjectiveStore()
        store.put_objective(SHEDDABLE, -1)
        self.director = Director(self.table, scheduler, clock, objectives=store, saturation=scheduler.saturation)
        self.slos = slos
        self.sheddable = shed

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        request = InferenceRequest(
            request_id=str(index),
            api=ApiKind.COMPLETIONS,
            model=MODEL,
            prompt=prompt_text(index, item),
            slo_ttft_ms=float(self.slos[index]) * 1e3,
            objective=SHEDDABLE if self.sheddable[index] else None,
        )
        try:
            decision = self.director.decide(request)
        except EppError as exc:
            if exc.code is not ErrorCode.RESOURCE_EXHAUSTED:
                raise
            return -1
        self._decisions[index] = decision
        return self.server_of(decision.slot)


def objectives(items: Sequence[Item], profile: EngineProfile, seed: int, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """Each request's TTFT objective (seconds) and class (an index). `relative`: a tier's multiple of its own
    unloaded TTFT on `profile` (its whole prompt prefilled, one step's fixed cost), so a long prompt gets a
    proportionally longer objective. Otherwise `share:seconds,...` classes (e.g. interactive 0.15 s, batch 10 s),
    each objective at least twice the request's own unloaded TTFT on `profile` (so every objective can be met
    somewhere)."""
    rng = np.random.default_rng(seed + 7)
    own = np.array([it.prompt_tokens * profile.prefill_s_per_token + profile.step_base_s for it in items])
    if spec == "relative":
        shares = np.array([s for s, _ in TIERS])
        multiples = np.array([m for _, m in TIERS])
        tier = rng.choice(len(TIERS), size=len(items), p=shares / shares.sum())
        return multiples[tier] * own, tier
    classes = [tuple(float(v) for v in part.split(":")) for part in spec.split(",")]
    shares = np.array([c[0] for c in classes])
    seconds = np.array([c[1] for c in classes])
    drawn = rng.choice(len(classes), size=len(items), p=shares / shares.sum())
    return np.maximum(seconds[drawn], 2.0 * own), drawn


class SloOracle(Oracle):
    """Knows each request's true TTFT on every endpoint (the engines' real queues and caches) and its objective:
    the endpoint that meets the objective with the least slack (the fast ones kept for tight objectives), else the
    fastest."""

    name = "slo-oracle"

    def __init__(self, engines: Sequence[Engine], seed: int, slos: np.ndarray) -> None:
        super().__init__(engines, seed)
        self.slos = slos

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        ttft = np.array([self.predicted_ttft(e, req) for e in self._engines])
        meets = np.flatnonzero(ttft <= self.slos[index])
        if meets.size:
            return int(meets[np.argmax(ttft[meets])])
        return int(np.argmin(ttft))


QUEUED = "slo-tiers-queued"  # slo-tiers behind the picker's own deadline-ordered queue


def flow_controlled(
    items: Sequence[Item],
    arrivals: np.ndarray,
    pool: Sequence[EngineProfile],
    doc: dict[str, object],
    slos: np.ndarray,
    sheddable: np.ndarray,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The picker with flow control in front (`slo_config(flow_control=True)`), in benchmarks.flow_control's harness
    (the real queues, gauge, director and scheduler; the same engines, scrapes and observation feed as `simulate`):
    each request's TTFT from its arrival (its wait in the picker's queue included; NaN: shed), whether it was
    dispatched, and its wait in the queue (NaN: shed). A sheddable request is of priority -1 (its own band)."""
    timed = [replace(item, arrival=float(at)) for item, at in zip(items, arrivals, strict=True)]
    priorities = [-1 if s else 0 for s in sheddable.tolist()]
    flows = [DEFAULT_FLOW] * len(items)
    setup = Setup(QUEUED, parse_config(doc, "<slo-queued>"))
    result = fc_simulate(timed, priorities, flows, list(pool), setup, QUEUE_TTL_S, seed=seed, slos=slos)
    served = np.array([outcome == Outcome.DISPATCHED.value for outcome in result.outcome])
    return result.ttft, served, result.served_at - arrivals


def run(args: argparse.Namespace) -> list[str]:
    items = load(args.workload, args.requests, None, args.seed)
    profiles = [profile_named(p.strip()) for p in args.profiles.split(",")]
    pool = [profiles[i % len(profiles)] for i in range(args.endpoints)]
    per = {p.name: capacity(items, p, seed=args.seed) for p in profiles}
    pool_capacity = sum(per[p.name] for p in pool)
    slos, classes = objectives(items, profiles[0], args.seed, args.objectives)
    names = (
        [f"{m:g}x" for _, m in TIERS]
        if args.objectives == "relative"
        else [f"{part.split(':')[1]} s" for part in args.objectives.split(",")]
    )
    n = len(pool)
    shed = np.random.default_rng(args.seed + 11).random(len(items)) < args.sheddable

    def slo(speed_tiers: bool = False, admitter: bool = False) -> Scheduler:
        # With speed tiers the tier filter does the packing across classes (loose objectives onto the slow one),
        # so the scorer's headroom strategy is its own (`--tiers-strategy`: `most` keeps margin within a class).
        strategy = args.tiers_strategy if speed_tiers else args.strategy
        doc = slo_config(args.latency_weight, strategy, speed_tiers=speed_tiers, admitter=admitter)
        return build_scheduler(parse_config(doc, "<slo>"), seed=args.seed)

    def factories() -> dict[str, object]:
        chosen: dict[str, object] = {
            "default": lambda e, c: SloPicker("epp", n, build_scheduler(None, seed=args.seed), c, slos, shed),
            "slo": lambda e, c: SloPicker("slo", n, slo(), c, slos, shed),
            "slo-tiers": lambda e, c: SloPicker("slo-tiers", n, slo(speed_tiers=True), c, slos, shed),
        }
        if args.sheddable > 0:  # the admitter refuses sheddable requests only
            chosen["slo-tiers-admit"] = lambda e, c: SloPicker(
                "slo-tiers-admit", n, slo(speed_tiers=True, admitter=True), c, slos, shed
            )
        # The picker's own queue in front of slo-tiers (benchmarks.flow_control's harness: the real queues, gauge,
        # director and scheduler), deadline-ordered: run below, not by `simulate`
        chosen[QUEUED] = None
        chosen["oracle"] = lambda e, c: Oracle(e, args.seed)
        chosen["slo-oracle"] = lambda e, c: SloOracle(e, args.seed, slos)
        return chosen

    lines = [
        f"workload {args.workload}, {len(items)} requests, {n} endpoints ({args.profiles} cycled), pool capacity "
        f"{pool_capacity:.1f} req/s, objectives {args.objectives}"
        + (" (multiples of the request's own unloaded TTFT)" if args.objectives == "relative" else " (share:seconds)")
        + f" on {profiles[0].name}; latency-scorer weight {args.latency_weight:g}, {args.strategy} "
        f"({args.tiers_strategy} with speed tiers); "
        f"sheddable {args.sheddable:g} ({int(shed.sum())} requests, priority -1)",
        "",
        f"| load | policy | SLO attainment | by class ({' / '.join(names)}) | shed | TTFT p50 ms | TTFT p90 ms | "
        "vs default | vs oracle | queue wait p50 / p90 ms (by class p90) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    skip = int(len(items) * args.warmup)
    for ld in [float(x) for x in args.load.split(",")]:
        arrivals = scaled_arrivals(items, ld * pool_capacity)
        got: dict[str, tuple[float, np.ndarray, str, int, str]] = {}
        kind = classes[skip:]
        for name, factory in factories().items():
            waits = "—"
            if factory is None:
                doc = slo_config(args.latency_weight, args.tiers_strategy, speed_tiers=True, flow_control=True)
                ttft_all, served, wait_all = flow_controlled(items, arrivals, pool, doc, slos, shed, args.seed)
                refused = int(np.count_nonzero(~served[skip:]))
                wait = wait_all[skip:]
                per_class = " / ".join(f"{np.nanpercentile(wait[kind == k], 90) * 1e3:.0f}" for k in range(len(names)))
                waits = f"{np.nanpercentile(wait, 50) * 1e3:.0f} / {np.nanpercentile(wait, 90) * 1e3:.0f} ({per_class})"
            else:
                result = simulate(items, arrivals, pool, factory, scrape_interval=args.scrape_interval)
                ttft_all, refused = result.ttft, int(np.count_nonzero(result.server[skip:] < 0))
            ttft = ttft_all[skip:]
            hit = ttft <= slos[skip:]
            by_class = " / ".join(f"{float(np.mean(hit[kind == k])):.3f}" for k in range(len(names)))
            got[name] = (float(np.mean(hit)), ttft, by_class, refused, waits)
        for name, (met, ttft, by_class, refused, waits) in got.items():
            lines.append(
                f"| {ld:.2f} | {name} | {met:.3f} | {by_class} | {refused} | {np.nanpercentile(ttft, 50) * 1e3:.0f} | "
                f"{np.nanpercentile(ttft, 90) * 1e3:.0f} | {met / got['default'][0]:.2f}x | "
                f"{met / got['oracle'][0]:.2f}x | {waits} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workload", default="azure-conv")
    p.add_argument("--load", default="0.8,1.1")
    p.add_argument("--endpoints", type=int, default=28)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--profiles", default="h100" + ",l4" * 13, help="cycled over the endpoints")
    p.add_argument("--scrape-interval", type=float, default=0.05)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-weight", type=float, default=2.0)
    p.add_argument("--strategy", default="least", choices=("least", "most"))
    p.add_argument("--tiers-strategy", default="most", choices=("least", "most"), help="the slo-tiers profiles'")
    p.add_argument("--objectives", default="0.5:0.15,0.5:10", help="share:seconds classes, or relative")
    p.add_argument(
        "--sheddable", type=float, default=0.0, help="share of requests marked sheddable (priority -1), drawn at random"
    )
    args = p.parse_args(argv)
    print("\n".join(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
