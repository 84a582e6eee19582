"""The default profile's filter → scorers → pick in one compiled call, when a profile is exactly that shape.

The shape (`default_config`, recognised once, when the runner is built): no producer; one filter, the saturation
filter (`utilization-detector`); scorers queue-scorer, kv-cache-utilization-scorer, prefix-cache-scorer (the
self-contained index) and inflight-load-scorer in that order, any positive weights; a max-score picker returning
one slot. Per pick the plugins cost ~130k instructions of Python and numpy dispatch for a few dozen multiplications
(benchmarks/RESULTS.md, stream_path); here `fused_pick` (epp/scheduling/_native.c) does the same steps element by
element, calling back only for the prefix lookup (hashing the prompt, matching the index: the scorer's own code).

A detailed pick (a route receipt, the degradation watch's sample, scores emitted) runs fused too: the same call
also writes the kept candidates, each scorer's weighted term (a terms × candidates buffer, `weighted_total_rows`'
rows) and constant part, which `run_detailed` keeps in the pick's state as the runner's detailed run does.

Not a definition: the plugins are, and the runner runs them whenever this answers None (a pool of more than
`framework.SMALL_POOL` candidates, an instrumented pick, `EPP_NATIVE=0`, no compiler, a column of another dtype).
tests/scheduling/test_fused.py holds the two equal: the same slots (the picker's own RNG, drawn the same times), the
same totals and the same detail (kept candidates, terms, constants). Observers (the prefix index's learning) run
after it as after the plugins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from epp.datastore import Freshness, Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, Filter, Picker, Scorer
from epp.scheduling.pick_detail import BUFFERS, SCORED, TERMS
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
        names: tuple[str, str, str, str],
    ) -> None:
        t = saturation.thresholds
        factor = 1.0 + t.headroom
        self.queue_limit, self.kv_limit = t.queue_depth * factor, t.kv_util * factor  # the filter's own arithmetic
        self.weights = weights
        self.draw = picker._draw  # the picker's RNG: the same draws as its `pick`
        self.staleness_s = freshness.staleness_s
        self.max_failures = freshness.max_failures
        self.names = names  # the scorers', in order: a detailed pick's terms are named by them
        self.lookup = prefix.lookup_first  # called by the kernel with the first candidate the filter kept
        # What every call passes unchanged, in the kernel's order.
        self._fixed = (
            self.max_failures, self.queue_limit, self.kv_limit, self.lookup, *weights, _TIE, self.draw,
        )  # fmt: skip
        # The snapshot the columns were read from, and its columns as memoryviews: the director's snapshot is the
        # table's cached view (`EndpointTable.view`, live columns), the same object pick after pick until
        # membership changes, and a memoryview hands the kernel its buffer for a fraction of what numpy's buffer
        # export costs per array (~400 instructions, six arrays a pick).
        self._snapshot: Snapshot | None = None
        self._columns: tuple[memoryview, ...] = ()
        # Likewise its slots (`Snapshot.slot_index`, the director's candidates when no subset narrows them).
        self._slots: IntArray | None = None
        self._slots_view: memoryview | None = None
        # None, or an array the kernel writes each run's totals into (the kept candidates', then NaN): the
        # equality test's window into a plain pick, which keeps no totals.
        self.totals: FloatArray | None = None
        # A detailed run's outputs by pool size (`run_detailed`).
        self._buffers: dict[int, _Buffers] = {}

    def _columns_of(self, snapshot: Snapshot) -> tuple[memoryview, ...]:
        if snapshot is not self._snapshot:
            self._columns = (  # `ndarray.data`: a memoryview of the array's memory
                snapshot.waiting.data, snapshot.picks_since_scrape.data, snapshot.kv_usage.data,
                snapshot.scraped_at.data, snapshot.scrape_failures.data, snapshot.prefill_tokens.data,
            )  # fmt: skip
            self._snapshot = snapshot
            slots = snapshot.slot_index
            self._slots, self._slots_view = slots, (slots.data if slots is not None else None)
        return self._columns

    def run(self, state: CycleState, candidates: IntArray) -> Sequence[int] | None:
        kernels = NATIVE
        if kernels is None:
            return None
        snapshot = state.snapshot
        columns = self._columns if snapshot is self._snapshot else self._columns_of(snapshot)
        slot = kernels.fused_pick(
            self._slots_view if candidates is self._slots else candidates,
            columns, state.now - self.staleness_s, state, self._fixed, self.totals, None,
        )  # fmt: skip
        return (slot,) if slot.__class__ is int else None

    def run_detailed(self, state: CycleState, candidates: IntArray) -> Sequence[int] | None:
        """`run`, keeping in `state` what the runner's detailed pick keeps (`pick_detail.SCORED`: the kept
        candidates and their totals; `pick_detail.TERMS`: each scorer's (name, has a term, constant part) and the
        terms' rows), written by the same kernel call; None where the plugins must run.

        The kernel writes into this runner's buffers for the pool's size, and the state gets read-only views of
        them, built once per shape of detail (kept count, which terms have rows, their constants): allocating the
        four arrays, slicing, reshaping and naming the terms per pick cost ~27k instructions, more than the kernel.
        So a detailed pick's arrays hold its values until this runner's next detailed pick of the same pool size:
        they are read before it (the director reads the detail and the receipt within `decide`, which does not
        await)."""
        kernels = NATIVE
        if kernels is None:
            return None
        size = candidates.size
        buffers = self._buffers.get(size)
        if buffers is None:
            buffers = self._buffers_of(size)
        snapshot = state.snapshot
        columns = self._columns if snapshot is self._snapshot else self._columns_of(snapshot)
        got = kernels.fused_pick(
            self._slots_view if candidates is self._slots else candidates,
            columns, state.now - self.staleness_s, state, self._fixed, buffers[3], buffers[4],
        )  # fmt: skip
        if got.__class__ is not tuple:
            return None
        slot, shape = got
        views = buffers[2].get(shape)
        if views is None:
            views = self._views_of(buffers, shape)
        scratch = state.scratch
        scratch[SCORED], scratch[TERMS], scratch[BUFFERS] = views
        return (slot,)

    def _buffers_of(self, size: int) -> _Buffers:
        """The kernel's output arrays for a pool of `size` candidates, with no views yet."""
        if len(self._buffers) >= 64:  # pool sizes seen (subsets narrow them): bounded
            self._buffers.clear()
        kept: IntArray = np.empty(size, dtype=np.int64)
        totals, rows, constants = np.empty(size), np.empty(4 * size), np.empty(4)
        # The kernel gets them as memoryviews (numpy's buffer export costs ~800 instructions an array, four a pick).
        buffers: _Buffers = (
            totals, (kept, rows, constants), {}, totals.data, (kept.data, rows.data, constants.data)
        )  # fmt: skip
        self._buffers[size] = buffers
        return buffers

    def _views_of(self, buffers: _Buffers, shape: tuple[int, ...]) -> _Views:
        """What the state keeps of a detailed pick of `shape` (the kernel's (k, has, the constants' bits)): views of
        the buffers, read-only (and as memoryviews: `pick_detail.BUFFERS`), and the terms' names with the constants
        (the values the kernel just wrote)."""
        totals, (kept, rows, constants), by_shape, *_ = buffers
        k, has = shape[0], shape[1]
        if len(by_shape) >= 64:
            by_shape.clear()
        named = [
            (name, bool(has >> t & 1), constant)
            for t, (name, constant) in enumerate(zip(self.names, constants.tolist(), strict=True))
        ]
        m = has.bit_count()
        out: tuple[np.ndarray, ...] = (kept[:k], totals[:k], rows[: m * k].reshape(m, k))
        for view in out:
            view.flags.writeable = False
        rows_out = out[2] if m else None
        buffers_out = (out[0].data, out[1].data, rows_out.data if rows_out is not None else None)
        views: _Views = ((out[0], out[1]), (named, rows_out), buffers_out)
        by_shape[shape] = views
        return views


# A pool size's kernel outputs: totals, (kept, rows, constants), the views of them by the detail's shape, and the
# outputs again as memoryviews (what the kernel is handed).
_Views = tuple[
    tuple[IntArray, FloatArray],
    tuple[list[tuple[str, bool, float]], FloatArray | None],
    tuple[memoryview, memoryview, memoryview | None],
]
_Buffers = tuple[
    FloatArray,
    tuple[IntArray, FloatArray, FloatArray],
    dict[tuple[int, ...], _Views],
    memoryview,
    tuple[memoryview, memoryview, memoryview],
]


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
    names = (scorers[0][0].name, scorers[1][0].name, scorers[2][0].name, scorers[3][0].name)
    return FusedDefault(filters[0], weights, prefix, picker, freshness, names)
