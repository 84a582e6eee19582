"""P/D disaggregation vs aggregated serving on the same GPUs, in virtual time.

The picker's own director and scheduler choose (upstream's P/D profiles with `prefix-based-pd-decider` at several
thresholds, or the same decode profile alone on an aggregated pool); the engine model serves. A disaggregated
request runs as llm-d's sidecar runs it: a single-token prefill on the prefill server (prefill-only batches),
then, after the KV transfer (`kv_transfer_s_per_token` × prompt tokens), a decode on the decode server that
computes only the first token (decode-only batches unless the decider sent the prefill there). TTFT is the decode
server's first token; TPOT is (finish − first token) / (output − 1).

    python -m benchmarks.pd --requests 300 --out benchmarks/pd.png

Deterministic for a seed; no clock is read.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.workloads import Item, prompt_text
from epp.config.decode import parse_config
from epp.datastore import EndpointInfo, EndpointTable, MetricsSample
from epp.director import Director
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler
from epp.sim.engine import Engine, SimRequest
from epp.sim.profiles import H100_LLAMA_8B, EngineProfile

MODEL = "m"
SCRAPE_S = 0.05
_STEP, _ARRIVAL, _SCRAPE, _TRANSFERRED = 0, 1, 2, 3


def config(threshold: int | None) -> Any:
    """Upstream's P/D sample with the decider at `threshold` (None: the decode profile alone, aggregated)."""
    profile = [{"pluginRef": "prefix-cache-scorer", "weight": 2}, {"pluginRef": "queue-scorer"}]
    plugins: list[dict[str, Any]] = [
        {"type": "approx-prefix-cache-producer"},
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
    ]
    doc: dict[str, Any] = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": plugins}
    if threshold is None:
        doc["schedulingProfiles"] = [{"name": "default", "plugins": profile}]
        return parse_config(doc, "aggregated")
    plugins.append({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "decider"}}})
    plugins.append({"name": "decider", "type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": threshold}})
    doc["schedulingProfiles"] = [
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, *profile]},
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, *profile]},
    ]
    return parse_config(doc, f"pd-{threshold}")


def workload(kind: str, n: int, rate: float, seed: int) -> list[Item]:
    """`long-prompt`: 4-8k-token prompts, 16-64 tokens out (summaries); `long-output`: 200-600 in, 300-700 out."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    if kind == "long-prompt":
        prompts, outputs = rng.integers(4000, 8000, n), rng.integers(16, 64, n)
    else:
        prompts, outputs = rng.integers(200, 600, n), rng.integers(300, 700, n)
    return [Item(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs, strict=True)]


@dataclass(frozen=True)
class Result:
    ttft: np.ndarray
    tpot: np.ndarray
    disaggregated: float  # share of requests that ran a prefill stage


def simulate(items: Sequence[Item], roles: Sequence[str], threshold: int | None, profile: EngineProfile) -> Result:
    engines = [Engine(profile) for _ in roles]
    table = EndpointTable()
    slots = [
        table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000", labels={"llm-d.ai/role": r}, pod_name=f"s{i}"))
        for i, r in enumerate(roles)
    ]
    table.synced = True
    server_of = {slot: i for i, slot in enumerate(slots)}
    now = 0.0
    director = Director(table, build_scheduler(config(threshold), seed=0), lambda: now)
    n = len(items)
    ttft, tpot = np.full(n, np.nan), np.full(n, np.nan)
    decisions: dict[int, Any] = {}
    decode_of: dict[int, int] = {}
    staged = 0
    seq = itertools.count()
    heap: list[tuple[float, int, int, int]] = [(it.arrival, next(seq), _ARRIVAL, i) for i, it in enumerate(items)]
    heap.append((0.0, next(seq), _SCRAPE, 0))
    heapq.heapify(heap)
    remaining = n

    def submit(server: int, req: SimRequest) -> None:
        engine = engines[server]
        engine.submit(req, now)
        if not engine.stepping:
            heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, server))

    def decode_leg(i: int, remote: bool) -> SimRequest:
        it = items[i]
        return SimRequest(2 * i + 1, it.prompt_tokens, it.output_tokens, remote_prefill=remote)

    while heap and remaining:
        now, _, kind, arg = heapq.heappop(heap)
        if kind == _STEP:
            engine = engines[arg]
            for fin in engine.end_step(now).finished:
                i, leg = divmod(fin.request_id, 2)
                if leg == 0:  # the prefill leg is done: pull the KV, then decode
                    at = now + items[i].prompt_tokens * profile.kv_transfer_s_per_token
                    heapq.heappush(heap, (at, next(seq), _TRANSFERRED, i))
                    continue
                ttft[i] = fin.first_token_at - items[i].arrival
                if fin.output_tokens > 1:
                    tpot[i] = (fin.finished_at - fin.first_token_at) / (fin.output_tokens - 1)
                director.complete(decisions.pop(i))
                remaining -= 1
            if engine.busy:
                heapq.heappush(heap, (now + engine.begin_step(now), next(seq), _STEP, arg))
        elif kind == _ARRIVAL:
            it = items[arg]
            request = InferenceRequest(
                request_id=str(arg), api=ApiKind.COMPLETIONS, model=MODEL, prompt=prompt_text(arg, it)
            )
            decision = director.decide(request)
            decisions[arg] = decision
            decode_of[arg] = server_of[decision.slot]
            if decision.stages:
                staged += 1
                prefill = server_of[decision.stages[0][0]]
                submit(prefill, SimRequest(2 * arg, it.prompt_tokens, 1))
            else:
                submit(decode_of[arg], decode_leg(arg, remote=False))
        elif kind == _TRANSFERRED:
            submit(decode_of[arg], decode_leg(arg, remote=True))
        else:
            for slot, e in zip(slots, engines, strict=True):
                sample = MetricsSample(
                    waiting=float(e.num_waiting),
                    running=float(e.num_running),
                    kv_usage=e.kv_usage,
                    block_size=float(profile.block_size),
                    num_blocks=float(profile.num_blocks),
                )
                table.record_scrape(slot, sample, now)
            heapq.heappush(heap, (now + SCRAPE_S, next(seq), _SCRAPE, 0))
    return Result(ttft, tpot, staged / n)


SETUPS: list[tuple[str, tuple[str, ...], int | None]] = [
    ("aggregated 4×both", ("both",) * 4, None),
    ("P/D 2P+2D, always", ("prefill", "prefill", "decode", "decode"), 1),
    ("P/D 2P+2D, ≥1024 uncached", ("prefill", "prefill", "decode", "decode"), 1024),
    ("P/D 2P+2D, ≥6000 uncached", ("prefill", "prefill", "decode", "decode"), 6000),
    ("P/D 1P+3D, always", ("prefill", "decode", "decode", "decode"), 1),
]
RATES = {"long-prompt": (4.0, 8.0), "long-output": (8.0, 16.0)}


def run(requests: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for kind, rates in RATES.items():
        for rate in rates:
            items = workload(kind, requests, rate, seed)
            for name, roles, threshold in SETUPS:
                r = simulate(items, roles, threshold, H100_LLAMA_8B)
                rows.append(
                    {
                        "workload": kind,
                        "rate": rate,
                        "setup": name,
                        "ttft_p90": float(np.nanpercentile(r.ttft, 90)),
                        "tpot_p90": float(np.nanpercentile(r.tpot, 90)),
                        "pd": r.disaggregated,
                    }
                )
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    out = ["| workload | req/s | setup | P/D share | p90 TTFT (s) | p90 TPOT (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['workload']} | {r['rate']:g} | {r['setup']} | {r['pd']:.0%} | {r['ttft_p90']:.3f} | "
            f"{r['tpot_p90'] * 1000:.1f} |"
        )
    return "\n".join(out)


def chart(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((r["workload"], r["rate"]) for r in rows))
    fig, axes = plt.subplots(2, len(cells), figsize=(4 * len(cells), 6), squeeze=False)
    for col, (kind, rate) in enumerate(cells):
        sub = [r for r in rows if r["workload"] == kind and r["rate"] == rate]
        names = [r["setup"] for r in sub]
        for row, (metric, label) in enumerate((("ttft_p90", "p90 TTFT (s)"), ("tpot_p90", "p90 TPOT (s)"))):
            ax = axes[row][col]
            ax.bar(range(len(sub)), [r[metric] for r in sub], color=["grey", *["tab:blue"] * (len(sub) - 1)])
            ax.set_xticks(range(len(sub)), names, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(f"{kind} @ {rate:g} req/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the chart here (PNG)")
    args = p.parse_args(argv)
    rows = run(args.requests, args.seed)
    print(markdown(rows))
    if args.out is not None:
        chart(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
