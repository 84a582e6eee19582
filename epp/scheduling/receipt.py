"""A route receipt: why one pick chose its endpoint, read from the pick's own state after it ran.

Users of prefix- and KV-aware routing find out late that the smart part did nothing (the KV feed silent, the prefix
index forgetting, the render call always failing): a receipt says, per request, what each weighted scorer gave the
chosen endpoint and the runner-up (weight × score), how old the data was that the chosen endpoint was judged on (its
metrics row, its last KV event), which producer or fallback ran (precise or approximate prefix, rendered or
estimated tokens), the profile(s) and the flow-control wait. The same values feed the aggregated metrics and the
degradation watch (`epp.scheduling.degradation`), so a receipt is also what the alarms are computed from.

`ReceiptReader` is built once per profile runner (it knows the profile's scorers and producers); `read` runs only on
a detailed pick (`ProfileScheduler.run(detailed=True)`: the terms are kept in the pick's state under
`pick_detail.TERMS`). Pure: `state.now`, no I/O; small pools use Python lists, where numpy's per-call cost is more
than the arithmetic.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

import orjson

from epp.datastore.table import FloatArray
from epp.scheduling.framework import CycleState, Producer, produced
from epp.scheduling.pick_detail import SCORED, TERMS
from epp.scheduling.precise import NEVER, PrecisePrefixCacheProducer
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.producers import ApproxPrefixCacheProducer, TokenProducer

METRICS_SOURCE = "metrics-data-source"  # upstream's data-source type: the scraped metric rows, as a plugin name


class Receipt(NamedTuple):
    """One pick's account. Addresses, not slots: it outlives the snapshot. Ages in seconds (inf: never)."""

    profiles: tuple[str, ...]
    chosen: str
    runner_up: str  # "" when only one candidate was scored
    scorers: tuple[str, ...]  # weighted scorers, in the profile's order
    chosen_terms: tuple[float, ...]  # weight × score each gave the chosen endpoint
    runner_terms: tuple[float, ...]  # … and the runner-up (empty without one)
    constant: tuple[bool, ...]  # per scorer: a term of 0 for every scored candidate (empty: fewer than 2)
    metrics_age_s: float  # the chosen endpoint's metrics row
    stale: int  # candidates whose metrics rows were scraped but are not usable now (too old, failing)
    missing: int  # candidates never scraped
    kv: tuple[tuple[str, str, int, int], ...]  # (precise producer, mode, stale candidates, absent candidates)
    kv_age_s: float  # the chosen endpoint's last KV event (NaN: no precise producer)
    tokens: tuple[tuple[str, bool], ...]  # (vllm token producer, engine token ids rendered)
    prefix: tuple[tuple[str, int, int], ...]  # (prefix plugin, the prompt's first block hash or 0, longest match)
    candidates: int = 0  # the pick's candidates (before its filters)
    flow_wait_s: float = 0.0

    def json(self) -> str:
        """The receipt as one compact JSON object (the `envoy.lb` field and the sampled log line)."""
        out: dict[str, object] = {
            "profiles": list(self.profiles),
            "chosen": self.chosen,
            "runnerUp": self.runner_up or None,
            "scorers": {
                name: [round(c, 4), round(self.runner_terms[i], 4) if self.runner_terms else None]
                for i, (name, c) in enumerate(zip(self.scorers, self.chosen_terms, strict=True))
            },
            "metricsAgeS": _age(self.metrics_age_s),
        }
        if self.kv:
            out["prefix"] = {name: mode for name, mode, _, _ in self.kv}
            out["kvEventsAgeS"] = _age(self.kv_age_s)
        if self.tokens:
            out["tokens"] = {name: "render" if exact else "estimate" for name, exact in self.tokens}
        if self.prefix:
            out["prefixHit"] = {name: reach > 0 for name, _, reach in self.prefix}
        if self.flow_wait_s:
            out["flowWaitS"] = round(self.flow_wait_s, 6)
        return orjson.dumps(out).decode()


def _age(seconds: float) -> float | None:
    return round(seconds, 3) if math.isfinite(seconds) else None


def _inert(values: FloatArray | None, constant: float) -> bool:
    """The scorer gave no candidate anything (0 everywhere): it could not tell them apart and added nothing. Equal
    non-zero terms are not inert: an idle pool's load scorers give every endpoint full marks, rightly."""
    if values is None:
        return constant == 0.0
    listed: list[float] = values.tolist()
    return constant + max(listed) == 0.0 and constant + min(listed) == 0.0


class ReceiptReader:
    """What one profile's picks are read for: its scorers (by the runner's terms), its precise producer, its vllm
    token producers, its prefix plugins that look blocks up themselves."""

    def __init__(self, profile: str, scorers: Sequence[object], producers: Sequence[Producer]) -> None:
        self.profile = profile
        self._precise = tuple(p for p in producers if isinstance(p, PrecisePrefixCacheProducer))
        self._tokens = tuple(p.name for p in producers if isinstance(p, TokenProducer) and p.backend == "vllm")
        lookups: list[PrefixCacheScorer | ApproxPrefixCacheProducer] = [
            s for s in scorers if isinstance(s, PrefixCacheScorer)
        ]
        lookups += [p for p in producers if isinstance(p, ApproxPrefixCacheProducer)]
        self._lookups = tuple(lookups)

    def watched(self, scorers: Sequence[str]) -> list[tuple[str, str]]:
        """The (plugin, reason) pairs the degradation watch follows for this profile."""
        pairs = [(name, "constant_output") for name in scorers]
        pairs += [(METRICS_SOURCE, "stale_signal"), (METRICS_SOURCE, "missing_signal")]
        for p in self._precise:
            pairs += [(p.name, "stale_signal"), (p.name, "missing_signal"), (p.name, "always_fallback")]
        pairs += [(name, "always_fallback") for name in self._tokens]
        pairs += [(p.name, "prefix_never_hits") for p in self._lookups]
        return pairs

    def read(self, state: CycleState, primary: int, flow_wait_s: float = 0.0) -> Receipt:
        """The receipt of a detailed pick whose primary slot is `primary`."""
        snapshot = state.snapshot
        addresses = snapshot.addresses
        now = state.now
        scored, total = state.scratch.get(SCORED, (None, None))
        terms: list[tuple[str, FloatArray | None, float]] = state.scratch.get(TERMS) or []
        runner = -1
        chosen_at = -1
        if scored is not None and total is not None and scored.size:
            listed: list[int] = scored.tolist()
            chosen_at = bisect_left(listed, primary)
            if chosen_at >= len(listed) or listed[chosen_at] != primary:
                chosen_at = -1
            if chosen_at >= 0 and len(listed) > 1:
                totals: list[float] = total.tolist()
                totals[chosen_at] = -math.inf
                runner = max(range(len(totals)), key=totals.__getitem__)
        names = tuple(name for name, _, _ in terms)
        chosen_terms = tuple(_term(t, c, chosen_at) for _, t, c in terms)
        runner_terms = tuple(_term(t, c, runner) for _, t, c in terms) if runner >= 0 else ()
        constant = tuple(_inert(t, c) for _, t, c in terms) if runner >= 0 else ()
        scraped = float(snapshot.scraped_at[primary])
        metrics_age = now - scraped if scraped == scraped else math.inf
        stale = missing = 0
        mask = state.usable(state.candidates)
        if mask is not None:
            for slot, ok in zip(state.candidates.tolist(), mask.tolist(), strict=True):
                if not ok:
                    if snapshot.scraped_at[slot] == snapshot.scraped_at[slot]:
                        stale += 1
                    else:
                        missing += 1
        kv: list[tuple[str, str, int, int]] = []
        kv_age = math.nan
        for p in self._precise:
            kv.append((p.name, *p.untrusted(state)))
            last = p.view.last_event_at(addresses[primary])
            kv_age = math.inf if last == NEVER else max(0.0, now - last)
        tokens = tuple((name, bool(getattr(produced(state, name), "exact", False))) for name in self._tokens)
        prefix = []
        for plugin in self._lookups:
            found = plugin.lookup(state)
            if found is not None:
                hashes, _, reach = found
                prefix.append((plugin.name, hashes[0] if hashes else 0, reach))
        return Receipt(
            (self.profile,),
            addresses[primary],
            addresses[int(scored[runner])] if runner >= 0 and scored is not None else "",
            names,
            chosen_terms,
            runner_terms,
            constant,
            metrics_age,
            stale,
            missing,
            tuple(kv),
            kv_age,
            tokens,
            tuple(prefix),
            int(state.candidates.size),
            flow_wait_s,
        )


def _term(values: FloatArray | None, constant: float, at: int) -> float:
    if at < 0:
        return 0.0
    return constant + (float(values[at]) if values is not None else 0.0)
