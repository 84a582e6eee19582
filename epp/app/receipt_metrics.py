"""Route receipts aggregated into metrics, the sampled receipt log line, and the degradation alarms' series and logs.

The director hands every receipt it reads here (`epp.director.director.ReceiptSink`): every pick with
`--emit-route-receipts`, otherwise one pick in `WATCH_EVERY` (the degradation watch's sample). Numbers are plain
counts on the serving loop, turned into families when `/metrics` is scraped (frozen on the loop first). Labels are
bounded by the config: scorer and producer names, a fixed set of modes and signals.

With serving workers each worker has its own director, watch and one of these; its exposition travels to the control
process, which sums the counters and takes the **max** of `llm_d_epp_degraded` over the workers (`MAX_FAMILIES`,
applied by `epp.app.workers.merge_expositions`): the picker is degraded while any worker sees the condition.

A picker of several pools has a director, so a watch, per pool (`attach`, as each pool's director is built): its
alarms carry the pool (`llm_d_epp_degraded{pool,plugin,reason}`, the log lines, /debug/pool); the receipts'
aggregates are the picker's, over every pool's picks.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, compress
from operator import itemgetter, sub
from typing import Any, cast

import numpy as np
from prometheus_client.core import Metric

from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.plain import PlainHistogram
from epp.scheduling.degradation import DegradationWatch, Transition
from epp.scheduling.receipt import Receipt, fold_compiled

log = logging.getLogger("epp.receipts")

DEGRADED = "llm_d_epp_degraded"
MAX_FAMILIES = frozenset({DEGRADED})  # with workers: the picker's value is the workers' max, not their sum
# Data age at pick, seconds: a scrape interval (50 ms by default) to the staleness horizon and past it.
DATA_AGE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
SIGNALS = ("metrics", "kv_events")
FOLD_EVERY = 256  # receipts held raw before they are folded into the counts
# A receipt's fields' positions (its columns in the fold).
_SCORERS, _CHOSEN, _RUNNER, _KV, _TOKENS, _PREFIX, _METRICS_AGE, _KV_AGE = map(
    Receipt._fields.index,
    ("scorers", "chosen_terms", "runner_terms", "kv", "tokens", "prefix", "metrics_age_s", "kv_age_s"),
)
_NAME_MODE, _NAME_REACH = itemgetter(0, 1), itemgetter(0, 2)  # of kv's (name, mode, …), prefix's (name, hash, reach)
_NAME, _REACH = itemgetter(0), itemgetter(2)
_POSITIVE = (0).__lt__  # reach > 0


class ReceiptMetrics(FreezableCollector):
    """The receipts' aggregates and the watch's alarms of one process (a worker's are summed by the control)."""

    def __init__(self) -> None:
        self.watches: list[DegradationWatch] = []  # the directors' (one per pool), attached as each is built
        self.receipts = 0
        self.contribution: dict[str, float] = {}
        self.margin: dict[str, float] = {}
        self.modes: dict[tuple[str, str], int] = {}
        self.ages = {signal: PlainHistogram(DATA_AGE) for signal in SIGNALS}
        # The receipts not yet folded; the director's compiled account appends to this list itself while it is
        # short of `fold_every` (all `receipt` does then), so it is emptied in place, never replaced.
        self.held: list[Receipt] = []
        self.fold_every = FOLD_EVERY

    # -- ReceiptSink ----------------------------------------------------------------------------------------------

    def receipt(self, receipt: Receipt, logged: bool) -> None:
        """Held raw, folded into the counts every `FOLD_EVERY` receipts and before every read (numpy over the batch:
        the request path pays one append)."""
        raw = self.held
        raw.append(receipt)
        if len(raw) >= self.fold_every:
            self._fold()
        if logged:
            log.info("route receipt %s", receipt.json())

    def _fold(self) -> None:
        """The held receipts into the counts: `_fold_python`, in one compiled call where it can be (`_receipt.fold`,
        the same doubles: ~0.3k instructions a receipt, where the Python's C loops cost ~4.8k)."""
        held = self.held
        if not held:
            return
        raw = held.copy()
        held.clear()
        metrics, kv_events = self.ages["metrics"], self.ages["kv_events"]
        got = fold_compiled(
            raw, self.contribution, self.margin, self.modes, DATA_AGE, metrics.counts, kv_events.counts,
            metrics.sum, kv_events.sum,
        )  # fmt: skip
        if got.__class__ is tuple:
            self.receipts += len(raw)
            metrics.sum, kv_events.sum = cast(tuple[float, float], got)
            return
        self._fold_python(raw)

    def _fold_python(self, raw: list[Receipt]) -> None:
        """The definition: the receipts `raw` into the counts. Per receipt only C loops (one `zip` transposing the
        batch into its fields' columns, `Counter`, numpy): a Python loop over them cost ~140 bytecodes a receipt,
        more than its read, and a field getter's pass per field ~0.1k instructions a receipt each."""
        n = len(raw)
        self.receipts += n
        modes = self.modes
        columns = tuple(zip(*raw, strict=True))  # the receipts' fields, each a tuple over the batch (Receipt's order)
        names_of: tuple[tuple[str, ...], ...] = columns[_SCORERS]
        chosen_rows: tuple[tuple[float, ...], ...] = columns[_CHOSEN]
        runner_rows: tuple[tuple[float, ...], ...] = columns[_RUNNER]
        if names_of.count(names_of[0]) == n:  # one profile's scorers (the usual case)
            if names_of[0]:
                self._fold_terms(names_of[0], chosen_rows, runner_rows)
        else:
            by_scorers: dict[tuple[str, ...], tuple[list[tuple[float, ...]], list[tuple[float, ...]]]] = {}
            for names, chosen, runner in zip(names_of, chosen_rows, runner_rows, strict=True):
                rows = by_scorers.setdefault(names, ([], []))
                rows[0].append(chosen)
                rows[1].append(runner)
            for names, (chosen_group, runner_group) in by_scorers.items():
                if names:
                    self._fold_terms(names, chosen_group, runner_group)
        kvs: tuple[tuple[tuple[str, str, int, int], ...], ...] = columns[_KV]
        if any(kvs):
            for (name, mode), k in Counter(map(_NAME_MODE, chain.from_iterable(kvs))).items():
                key = (name, "precise" if mode == "precise" else "approximate")
                modes[key] = modes.get(key, 0) + k
        for (name, exact), k in Counter(chain.from_iterable(columns[_TOKENS])).items():
            key = (name, "render" if exact else "estimate")
            modes[key] = modes.get(key, 0) + k
        prefixes = tuple(chain.from_iterable(columns[_PREFIX]))
        plugins = set(map(_NAME, prefixes))
        if len(plugins) == 1:  # one prefix plugin (the usual case): its hits counted, no (name, reach) key each
            (name,) = plugins
            hits = sum(map(_POSITIVE, map(_REACH, prefixes)))
            for key, k in (((name, "hit"), hits), ((name, "miss"), len(prefixes) - hits)):
                if k:
                    modes[key] = modes.get(key, 0) + k
        elif plugins:
            for (name, reach), k in Counter(map(_NAME_REACH, prefixes)).items():
                key = (name, "hit" if reach > 0 else "miss")
                modes[key] = modes.get(key, 0) + k
        ages = np.fromiter(columns[_METRICS_AGE], np.float64, n)
        ages = ages[ages < math.inf]  # NaN and inf: no age
        if ages.size:
            self.ages["metrics"].observe_all(ages)
        if any(kvs):
            kv_ages = np.fromiter(columns[_KV_AGE], np.float64, n)
            kv_ages = kv_ages[np.fromiter(map(bool, kvs), np.bool_, n) & (kv_ages < math.inf)]
            if kv_ages.size:
                self.ages["kv_events"].observe_all(kv_ages)

    def _fold_terms(
        self,
        names: tuple[str, ...],
        chosen_rows: Sequence[tuple[float, ...]],
        runner_rows: Sequence[tuple[float, ...]],
    ) -> None:
        """Each scorer's contribution (its chosen terms summed) and margin (chosen minus runner-up, over the
        receipts with a runner-up) of receipts naming `names`, their terms `chosen_rows` and `runner_rows`; a receipt
        whose terms are not one per scorer is left out of that sum."""
        contribution, margin = self.contribution, self.margin
        width = len(names)
        runner_widths = set(map(len, runner_rows))
        chosen_sums: list[float]
        margin_sums: list[float] | None
        if set(map(len, chosen_rows)) == {width} and runner_widths <= {width, 0}:
            # The usual case: every receipt has its terms, some a runner-up's too (the others none: one candidate).
            # Summed by column (`zip` transposes the rows; numpy's conversion of the rows cost ~5k instructions a
            # receipt of 4 terms, more than the sums), the margin as the paired receipts' sum less the runner-ups'
            # (the sum of the differences but for rounding).
            chosen_sums = list(map(sum, zip(*chosen_rows, strict=True)))
            paired_sums = chosen_sums
            if 0 in runner_widths:
                paired_sums = list(map(sum, zip(*compress(chosen_rows, runner_rows), strict=True)))
                runner_rows = tuple(filter(None, runner_rows))
            margin_sums = (
                list(map(sub, paired_sums, map(sum, zip(*runner_rows, strict=True))))
                if runner_rows and paired_sums
                else None
            )
        else:
            chosen = np.array([c for c in chosen_rows if len(c) == width], dtype=np.float64)
            runner = np.array([r for r in runner_rows if len(r) == width], dtype=np.float64)
            both = np.array(
                [c for c, r in zip(chosen_rows, runner_rows, strict=True) if len(r) == width], dtype=np.float64
            )
            chosen_sums = chosen.sum(axis=0).tolist() if chosen.size else [0.0] * width
            margin_sums = (both - runner).sum(axis=0).tolist() if runner.size else None
        for k, name in enumerate(names):
            contribution[name] = contribution.get(name, 0.0) + chosen_sums[k]
            if margin_sums is not None:
                margin[name] = margin.get(name, 0.0) + margin_sums[k]

    def attach(self, watch: DegradationWatch | None) -> None:
        """A director's watch (None: a scheduler without receipts); its states are exported from now on."""
        if watch is not None and all(w is not watch for w in self.watches):
            self.watches.append(watch)

    def transition(self, transition: Transition) -> None:
        where = f"pool {transition.pool}: " if transition.pool else ""
        if transition.active:
            log.warning(
                "degraded: %s%s %s (%.0f%% of the last window's picks); see llm_d_epp_degraded and "
                "docs/observability.md",
                where, transition.plugin, transition.reason, 100 * transition.bad_ratio,
            )  # fmt: skip
        else:
            log.info("degradation cleared: %s%s %s", where, transition.plugin, transition.reason)

    def active(self, now: float) -> list[dict[str, object]]:
        """The episodes in progress, for /debug/pool."""
        return [episode for watch in self.watches for episode in watch.active(now)]

    # -- collection -----------------------------------------------------------------------------------------------

    def snapshot(self) -> Any:
        self._fold()
        states = [(watch.pool, *state) for watch in self.watches for state in watch.states()]
        ages = {}
        for signal, hist in self.ages.items():
            copy = PlainHistogram(DATA_AGE)
            copy.add(hist)
            ages[signal] = copy
        return (self.receipts, dict(self.contribution), dict(self.margin), dict(self.modes), ages, states)

    def families(self, data: Any) -> Iterator[Metric]:
        receipts, contribution, margin, modes, ages, states = data
        # A picker of one pool keeps upstream-shaped (plugin, reason) series; several pools add the pool.
        pooled = any(pool for pool, *_ in states)
        labels = ("pool", "plugin", "reason") if pooled else ("plugin", "reason")
        at = 0 if pooled else 1
        yield gauge_family(
            DEGRADED, "1 while a silent degradation episode is active for (plugin, reason), else 0.",
            labels, [((pool, p, r)[at:], 1.0 if active else 0.0) for pool, p, r, active, _ in states],
        )  # fmt: skip
        yield counter_family(
            "llm_d_epp_degraded_episodes", "Silent degradation episodes begun, by plugin and reason.",
            labels, [((pool, p, r)[at:], float(n)) for pool, p, r, _, n in states],
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
        {
            **({"pool": sample.labels["pool"]} if sample.labels.get("pool") else {}),
            "plugin": sample.labels.get("plugin", ""),
            "reason": sample.labels.get("reason", ""),
        }
        for family in families
        if family.name == DEGRADED
        for sample in family.samples
        if sample.value >= 1.0
    ]
