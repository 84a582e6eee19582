"""The default profile's filter → scorers → pick in one compiled call, when a profile is exactly that shape.

The shape (`default_config`, recognised once, when the runner is built): no producer; one filter, the saturation
filter (`utilization-detector`); scorers queue-scorer, kv-cache-utilization-scorer, prefix-cache-scorer (the
self-contained index) and inflight-load-scorer in that order, any positive weights; a max-score picker returning
one slot. Per pick the plugins cost ~130k instructions of Python and numpy dispatch for a few dozen multiplications
(benchmarks/RESULTS.md, stream_path); here `fused_pick` (epp/scheduling/_native.c) does the same steps element by
element, calling back only for the prefix lookup (hashing the prompt, matching the index: the scorer's own code).

Not a definition: the plugins are, and the runner runs them whenever this answers None (a pool of more than
`framework.SMALL_POOL` candidates, a detailed or instrumented pick, `EPP_NATIVE=0`, no compiler, a column of
another dtype). tests/scheduling/test_fused.py holds the two equal: the same slots (the picker's own RNG, drawn
the same times) and the same totals. Observers (the prefix index's learning) run after it as after the plugins.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """The default profile's run as one kernel call; `run` answers None where the plugins must run."""

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
        self.draw = picker._draw  # the picker's RNG: the same draws as its `pick`
        self.staleness_s = freshness.staleness_s
        self.max_failures = freshness.max_failures
        self.lookup = prefix.lookup_first  # called by the kernel with the first candidate the filter kept
        # None, or an array the kernel writes each run's totals into (the kept candidates', then NaN): the
        # equality test's window into a plain pick, which keeps no totals.
        self.totals: FloatArray | None = None

    def run(self, state: CycleState, candidates: IntArray) -> Sequence[int] | None:
        kernels = NATIVE
        if kernels is None:
            return None
        snapshot = state.snapshot
        wq, wkv, wp, wi = self.weights
        slot = kernels.fused_pick(
            candidates, snapshot.waiting, snapshot.picks_since_scrape, snapshot.kv_usage, snapshot.scraped_at,
            snapshot.scrape_failures, state.now - self.staleness_s, self.max_failures, self.queue_limit,
            self.kv_limit, self.lookup, state, wq, wkv, wp, wi, _TIE, self.draw, self.totals,
        )  # fmt: skip
        return (slot,) if slot.__class__ is int else None


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
