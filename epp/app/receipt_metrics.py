"""Route receipts aggregated into metrics, the sampled receipt log line, and the degradation alarms' series and logs.

The director hands every receipt it reads here (`epp.director.director.ReceiptSink`): every pick with
`--emit-route-receipts`, otherwise one pick in `WATCH_EVERY` (the degradation watch's sample). Numbers are plain
counts on the serving loop, turned into families when `/metrics` is scraped (frozen on the loop first). Labels are
bounded by the config: scorer and producer names, a fixed set of modes and signals.

With serving workers each worker has its own director, watch and one of these; its exposition travels to the control
process, which sums the counters and takes the **max** of `llm_d_epp_degraded` over the workers (`MAX_FAMILIES`,
applied by `epp.app.workers.merge_expositions`): the picker is degraded while any worker sees the condition.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from prometheus_client.core import Metric

from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.plain import PlainHistogram
from epp.scheduling.degradation import DegradationWatch, Transition
from epp.scheduling.receipt import Receipt

log = logging.getLogger("epp.receipts")

DEGRADED = "llm_d_epp_degraded"
MAX_FAMILIES = frozenset({DEGRADED})  # with workers: the picker's value is the workers' max, not their sum
# Data age at pick, seconds: a scrape interval (50 ms by default) to the staleness horizon and past it.
DATA_AGE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
SIGNALS = ("metrics", "kv_events")
FOLD_EVERY = 256  # receipts held raw before they are folded into the counts


class ReceiptMetrics(FreezableCollector):
    """The receipts' aggregates and the watch's alarms of one process (a worker's are summed by the control)."""

    def __init__(self) -> None:
        self.watch: DegradationWatch | None = None  # the director's, attached once it is built
        self.receipts = 0
        self.contribution: dict[str, float] = {}
        self.margin: dict[str, float] = {}
        self.modes: dict[tuple[str, str], int] = {}
        self.ages = {signal: PlainHistogram(DATA_AGE) for signal in SIGNALS}
        self._raw: list[Receipt] = []

    # -- ReceiptSink ----------------------------------------------------------------------------------------------

    def receipt(self, receipt: Receipt, logged: bool) -> None:
        """Held raw, folded into the counts every `FOLD_EVERY` receipts and before every read (numpy over the batch:
        the request path pays one append)."""
        raw = self._raw
        raw.append(receipt)
        if len(raw) >= FOLD_EVERY:
            self._fold()
        if logged:
            log.info("route receipt %s", receipt.json())

    def _fold(self) -> None:
        raw, self._raw = self._raw, []
        if not raw:
            return
        self.receipts += len(raw)
        contribution, margin, modes = self.contribution, self.margin, self.modes
        by_scorers: dict[tuple[str, ...], list[Receipt]] = {}
        for receipt in raw:
            by_scorers.setdefault(receipt.scorers, []).append(receipt)
            for name, mode, _, _ in receipt.kv:
                key = (name, "precise" if mode == "precise" else "approximate")
                modes[key] = modes.get(key, 0) + 1
            for name, exact in receipt.tokens:
                key = (name, "render" if exact else "estimate")
                modes[key] = modes.get(key, 0) + 1
            for name, _, reach in receipt.prefix:
                key = (name, "hit" if reach > 0 else "miss")
                modes[key] = modes.get(key, 0) + 1
        for names, group in by_scorers.items():
            chosen = np.array([r.chosen_terms for r in group if len(r.chosen_terms) == len(names)], dtype=np.float64)
            runner = np.array([r.runner_terms for r in group if len(r.runner_terms) == len(names)], dtype=np.float64)
            paired = np.array(
                [r.chosen_terms for r in group if len(r.runner_terms) == len(names)], dtype=np.float64
            )  # fmt: skip
            chosen_sums = chosen.sum(axis=0).tolist() if chosen.size else [0.0] * len(names)
            margin_sums = (paired - runner).sum(axis=0).tolist() if runner.size else None
            for k, name in enumerate(names):
                contribution[name] = contribution.get(name, 0.0) + chosen_sums[k]
                if margin_sums is not None:
                    margin[name] = margin.get(name, 0.0) + margin_sums[k]
        ages = [r.metrics_age_s for r in raw if r.metrics_age_s < math.inf]
        if ages:
            self.ages["metrics"].observe_all(ages)
        kv_ages = [r.kv_age_s for r in raw if r.kv and r.kv_age_s < math.inf]
        if kv_ages:
            self.ages["kv_events"].observe_all(kv_ages)

    def transition(self, transition: Transition) -> None:
        if transition.active:
            log.warning(
                "degraded: %s %s (%.0f%% of the last window's picks); see llm_d_epp_degraded and docs/observability.md",
                transition.plugin, transition.reason, 100 * transition.bad_ratio,
            )  # fmt: skip
        else:
            log.info("degradation cleared: %s %s", transition.plugin, transition.reason)

    def active(self, now: float) -> list[dict[str, object]]:
        """The episodes in progress, for /debug/pool."""
        return self.watch.active(now) if self.watch is not None else []

    # -- collection -----------------------------------------------------------------------------------------------

    def snapshot(self) -> Any:
        self._fold()
        states = self.watch.states() if self.watch is not None else []
        ages = {}
        for signal, hist in self.ages.items():
            copy = PlainHistogram(DATA_AGE)
            copy.add(hist)
            ages[signal] = copy
        return (self.receipts, dict(self.contribution), dict(self.margin), dict(self.modes), ages, states)

    def families(self, data: Any) -> Iterator[Metric]:
        receipts, contribution, margin, modes, ages, states = data
        yield gauge_family(
            DEGRADED, "1 while a silent degradation episode is active for (plugin, reason), else 0.",
            ("plugin", "reason"), [((p, r), 1.0 if active else 0.0) for p, r, active, _ in states],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_degraded_episodes", "Silent degradation episodes begun, by plugin and reason.",
            ("plugin", "reason"), [((p, r), float(n)) for p, r, _, n in states],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_route_receipts", "Route receipts read (every pick with --emit-route-receipts, else a sample).",
            (), [((), float(receipts))],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_scorer_contribution", "Sum over receipts of weight x score each scorer gave the chosen one.",
            ("plugin",), [((name,), value) for name, value in sorted(contribution.items())],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_scorer_margin", "Sum over receipts of each scorer's chosen minus runner-up contribution.",
            ("plugin",), [((name,), value) for name, value in sorted(margin.items())],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_pick_producer", "Receipts by the producer or fallback that ran (render/estimate, "
            "precise/approximate, hit/miss).",
            ("plugin", "mode"), [(key, float(n)) for key, n in sorted(modes.items())],
        )  # fmt: skip
        yield histogram_family(
            "llm_d_epp_pick_data_age_seconds", "Age at pick of the data the chosen endpoint was judged on.",
            ("signal",), [((signal,), hist) for signal, hist in ages.items()],
        )  # fmt: skip


def active_in(families: Iterable[Metric]) -> list[dict[str, object]]:
    """The episodes in progress in merged expositions (serving workers: the control process's /debug/pool)."""
    return [
        {"plugin": sample.labels.get("plugin", ""), "reason": sample.labels.get("reason", "")}
        for family in families
        if family.name == DEGRADED
        for sample in family.samples
        if sample.value >= 1.0
    ]
