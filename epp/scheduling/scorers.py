"""Load and KV-cache scorers: one vector expression each over the candidate slots.

NaN policy, shared by every scorer here: an endpoint whose signal is unknown (never scraped, or its engine does not
export the metric) scores 0.5, the middle of the scale. 1.0 would make the least-known endpoint attract every burst,
0.0 would starve an endpoint whose engine simply lacks the metric; 0.5 lets the other scorers decide. The score of
the *known* endpoints is computed among themselves (min-max over the known values), so one unknown endpoint does not
flatten everyone else's ranking.
"""

from __future__ import annotations

import math

import numpy as np

from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import AffineScore, CycleState

NEUTRAL = 0.5


def lower_is_better(values: FloatArray, bounds: tuple[float, float] | None = None) -> FloatArray:
    """Upstream's min-max normalisation: (max − v) / (max − min); all equal → 1.0; NaN → NEUTRAL.

    `bounds` is (min, max) of `values` when the caller has it (`CycleState.bounds`, shared per pick). The common
    case (no NaN) then costs two ufunc calls; with NaN present, `fmin`/`fmax` skip the unknown entries so they do
    not poison the range, and those entries get NEUTRAL.
    """
    lo, hi = bounds if bounds is not None else (np.minimum.reduce(values), np.maximum.reduce(values))
    if lo == lo:  # no NaN anywhere (NaN propagates through minimum)
        if hi > lo:
            out: FloatArray = hi - values
            out /= hi - lo  # a division, not a reciprocal: 1 / a subnormal range overflows to inf
            return out
        return np.ones(values.size)  # all equal → 1.0 (upstream)
    lo, hi = np.fmin.reduce(values), np.fmax.reduce(values)
    out = (hi - values) / (hi - lo) if hi > lo else np.ones(values.size)
    out[np.isnan(values)] = NEUTRAL
    return out


def lower_is_better_affine(values: FloatArray, lo: float, hi: float) -> AffineScore | None:
    """`lower_is_better` as scale × values + offset, when the range is known and usable (see `Affine`)."""
    if not hi > lo:  # all equal → 1.0; NaN → the general path
        return (None, 0.0, 1.0) if lo == hi else None
    scale = 1.0 / (hi - lo)
    offset = hi * scale
    if not (math.isfinite(scale) and math.isfinite(offset)):  # a subnormal range: the general path divides
        return None
    return values, -scale, offset


class QueueScorer:
    """`queue-scorer`: fewer waiting requests (as last scraped) score higher, min-max over the candidates."""

    type_name = "queue-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "queue-scorer") -> None:
        self.name = name

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        return lower_is_better(state.take(state.snapshot.waiting, candidates), state.bounds("waiting", candidates))

    def affine(self, state: CycleState, candidates: IntArray) -> AffineScore | None:
        return lower_is_better_affine(
            state.take(state.snapshot.waiting, candidates), *state.bounds("waiting", candidates)
        )


class RunningRequestsScorer:
    """`running-requests-size-scorer`: fewer running requests score higher, min-max over the candidates."""

    type_name = "running-requests-size-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "running-requests-size-scorer") -> None:
        self.name = name

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        return lower_is_better(state.take(state.snapshot.running, candidates), state.bounds("running", candidates))

    def affine(self, state: CycleState, candidates: IntArray) -> AffineScore | None:
        return lower_is_better_affine(
            state.take(state.snapshot.running, candidates), *state.bounds("running", candidates)
        )


class KvCacheUtilizationScorer:
    """`kv-cache-utilization-scorer`: 1 − KV-cache usage, clamped (an engine may report 1.02); unknown → 0.5."""

    type_name = "kv-cache-utilization-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "kv-cache-utilization-scorer") -> None:
        self.name = name

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        kv = state.take(state.snapshot.kv_usage, candidates)
        out = 1.0 - kv
        lo, hi = state.bounds("kv_usage", candidates)
        if lo >= 0.0 and hi <= 1.0:  # no NaN, nothing out of range
            return out
        np.fmax(out, 0.0, out=out)
        np.fmin(out, 1.0, out=out)
        out[np.isnan(kv)] = NEUTRAL
        return out

    def affine(self, state: CycleState, candidates: IntArray) -> AffineScore | None:
        lo, hi = state.bounds("kv_usage", candidates)
        if lo >= 0.0 and hi <= 1.0:  # no NaN, nothing out of range: exactly 1 − kv
            return state.take(state.snapshot.kv_usage, candidates), -1.0, 1.0
        return None


class InflightLoadScorer:
    """`inflight-load-scorer` (ours): the queue as it is *now*, not as the last scrape saw it.

    Effective queue = last scraped `waiting` + the picks this picker made to the endpoint since that scrape. Between
    two scrapes upstream's queue scorer sees the same numbers for every request, so a burst lands on whichever
    endpoint looked emptiest; counting our own picks makes the emptiest endpoint fill up in the score as it does in
    reality, and the burst spreads. Unknown `waiting` counts as the mean effective queue of the known candidates (an
    endpoint we cannot see is assumed typical, plus the picks we sent it); min-max as the queue scorer.
    """

    type_name = "inflight-load-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "inflight-load-scorer") -> None:
        self.name = name

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        load = state.take(state.effective_queue(), candidates)  # shared with the filter: never written here
        lowest = state.extreme("effective_queue", candidates, False)
        if lowest != lowest:  # NaN present: unknown waiting counts as the known candidates' mean
            snapshot = state.snapshot
            unknown = np.isnan(load)
            known = load[~unknown]
            typical = float(known.mean()) if known.size else 0.0
            load = np.where(unknown, typical + state.take(snapshot.picks_since_scrape, candidates), load)
            return lower_is_better(load)
        return lower_is_better(load, (lowest, state.extreme("effective_queue", candidates, True)))

    def affine(self, state: CycleState, candidates: IntArray) -> AffineScore | None:
        lo, hi = state.bounds("effective_queue", candidates)
        if lo != lo:  # NaN present: the general path fills in unknown waiting
            return None
        return lower_is_better_affine(state.take(state.effective_queue(), candidates), lo, hi)
