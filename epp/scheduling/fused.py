"""The default profile's filter → scorers → pick in two compiled calls, when a profile is exactly that shape.

The shape (`default_config`, recognised once, when the runner is built): no producer; one filter, the saturation
filter (`utilization-detector`); scorers queue-scorer, kv-cache-utilization-scorer, prefix-cache-scorer (the
self-contained index) and inflight-load-scorer in that order, any positive weights; a max-score picker returning
one slot. Per pick the plugins cost ~130k instructions of Python and numpy dispatch for a few dozen multiplications
(benchmarks/RESULTS.md, stream_path); here `fused_filter` and `fused_score` (epp/scheduling/_native.c) do the same
steps element by element, and only the prefix lookup (hashing the prompt, matching the index) stays the scorer's own.

Not a definition: the plugins are, and the runner runs them whenever this answers None (a pool of more than
`framework.SMALL_POOL` candidates, a detailed or instrumented pick, `EPP_NATIVE=0`, no compiler, a column of
another dtype). tests/scheduling/test_fused.py holds the two equal: the same slots (the picker's own RNG, drawn
the same times) and the same totals. Observers (the prefix index's learning) run after it as after the plugins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from epp.datastore import Freshness
from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, Filter, Picker, Scorer
from epp.scheduling.pickers import _TIE, MaxScorePicker
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.saturation import SaturationFilter
from epp.scheduling.scorers import InflightLoadScorer, KvCacheUtilizationScorer, QueueScorer
from epp.scheduling.totals import NATIVE

_SHAPE = (QueueScorer, KvCacheUtilizationScorer, PrefixCacheScorer, InflightLoadScorer)


class FusedDefault:
    """The default profile's run as two kernel calls; `run` answers None where the plugins must run."""

    def __init__(
        self,
        saturation: SaturationFilter,
        weights: tuple[float, float, float, float],
        prefix: PrefixCacheScorer,
        picker: MaxScorePicker,
        freshness: Freshness,
    ) -> None:
        t = saturation.thresholds
        factor = 1.0 + t.headroom
        self.queue_limit, self.kv_limit = t.queue_depth * factor, t.kv_util * factor  # the filter's own arithmetic
        self.weights = weights
        self.prefix = prefix
        self.draw = picker._draw  # the picker's RNG: the same draws as its `pick`
        self.staleness_s = freshness.staleness_s
        self.max_failures = freshness.max_failures
        self.last_total: FloatArray | None = None  # the last run's totals (for the equality test)

    def run(self, state: CycleState, candidates: IntArray) -> Sequence[int] | None:
        kernels = NATIVE
        n = candidates.size
        if kernels is None or n == 0:
            return None
        snapshot = state.snapshot
        waiting, picks, kv = snapshot.waiting, snapshot.picks_since_scrape, snapshot.kv_usage
        scraped_at, failures = snapshot.scraped_at, snapshot.scrape_failures
        fresh_from = state.now - self.staleness_s
        kept: IntArray = np.empty(n, dtype=np.int64)
        count = kernels.fused_filter(
            candidates, waiting, picks, kv, scraped_at, failures, fresh_from, self.max_failures,
            self.queue_limit, self.kv_limit, kept,
        )  # fmt: skip
        if count.__class__ is not int:
            return None
        if count != n:
            candidates = kept[:count]
        hashes, matched, reach = self.prefix.lookup_for(state, candidates)
        total: FloatArray = np.empty(candidates.size)
        wq, wkv, wp, wi = self.weights
        choice = kernels.fused_score(
            candidates, waiting, picks, kv, scraped_at, failures, fresh_from, self.max_failures,
            matched if reach else None, 1.0 / len(hashes) if reach else 0.0,
            wq, wkv, wp, wi, _TIE, self.draw, total,
        )  # fmt: skip
        if choice.__class__ is not int:
            return None
        self.last_total = total
        return (candidates.item(choice),)


def fused_default(
    producers: Sequence[object],
    filters: Sequence[Filter],
    scorers: Sequence[tuple[Scorer, float]],
    picker: Picker,
    freshness: Freshness,
) -> FusedDefault | None:
    """The fused run of a profile of exactly the default shape (the module docstring); None for any other."""
    if NATIVE is None or producers or len(filters) != 1 or type(filters[0]) is not SaturationFilter:
        return None
    if len(scorers) != len(_SHAPE) or any(
        type(s) is not k or w <= 0 for (s, w), k in zip(scorers, _SHAPE, strict=True)
    ):
        return None
    if type(picker) is not MaxScorePicker or picker.max_endpoints != 1:
        return None
    prefix = scorers[2][0]
    assert isinstance(prefix, PrefixCacheScorer)
    weights = (scorers[0][1], scorers[1][1], scorers[2][1], scorers[3][1])
    return FusedDefault(filters[0], weights, prefix, picker, freshness)
