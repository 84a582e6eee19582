"""Load and KV-cache scorers: each a `Linear` form of one signal over the candidate slots.

NaN policy, shared by every scorer here: an endpoint whose signal is unknown (never scraped, its engine does not
export the metric, or its data is not usable: older than the staleness threshold or failing, `CycleState.signal`)
scores 0.5, the middle of the scale. 1.0 would make the least-known endpoint attract every burst,
0.0 would starve an endpoint whose engine simply lacks the metric; 0.5 lets the other scorers decide. The score of
the *known* endpoints is computed among themselves (min-max over the known values), so one unknown endpoint does not
flatten everyone else's ranking.
"""

from __future__ import annotations

import math

import numpy as np

from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, Extremes, Linear, LinearScorer, Signal, extremes

NEUTRAL = 0.5
_MAX_SCALE = 1e300  # 1 / the smallest range that ranks endpoints; a weight up to 1e8 times it stays finite


def lower_is_better(values: FloatArray, bounds: Extremes | None = None) -> Linear:
    """Upstream's min-max normalisation: (max − v) / (max − min); all equal → 1.0; NaN → NEUTRAL.

    `bounds` are the `extremes` of `values` when the caller has them (`CycleState.extremes`, shared per pick); the
    range is that of the known values, so one unknown endpoint does not flatten everyone else's ranking. A range
    below 1e-300 counts as all equal: the runner multiplies the reciprocal by the scorer's weight, which overflows to
    infinity for a subnormal range (then 0 × inf = NaN in the total), and no metric tells endpoints apart there.
    """
    lo, hi, unknown = bounds if bounds is not None else extremes(values)
    fill = NEUTRAL if unknown else None
    if hi > lo:
        scale = 1.0 / (hi - lo)
        offset = hi * scale
        if scale <= _MAX_SCALE and math.isfinite(offset):
            return Linear(values, -scale, offset, fill)
    if lo == lo:  # known values, all equal → 1.0 (upstream); unknown ones still NEUTRAL
        return Linear(values if unknown else None, 0.0, 1.0, fill)
    return Linear(None, 0.0, NEUTRAL)  # nothing known


class MinMaxScorer(LinearScorer):
    """Fewer is better: `lower_is_better` of one signal over the candidates. A subclass only names the signal."""

    signal: Signal

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        return lower_is_better(*state.signal(self.signal, candidates))


class QueueScorer(MinMaxScorer):
    """`queue-scorer`: fewer waiting requests (as last scraped) score higher, min-max over the candidates."""

    type_name = "queue-scorer"
    signal = Signal.WAITING


class RunningRequestsScorer(MinMaxScorer):
    """`running-requests-size-scorer`: fewer running requests score higher, min-max over the candidates."""

    type_name = "running-requests-size-scorer"
    signal = Signal.RUNNING


class KvCacheUtilizationScorer(LinearScorer):
    """`kv-cache-utilization-scorer`: 1 − KV-cache usage, clamped (an engine may report 1.02); unknown → 0.5."""

    type_name = "kv-cache-utilization-scorer"

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        kv, (lo, hi, unknown) = state.signal(Signal.KV_USAGE, candidates)
        if lo < 0.0 or hi > 1.0:
            kv = np.clip(kv, 0.0, 1.0)  # NaN stays NaN
        return Linear(kv, -1.0, 1.0, NEUTRAL if unknown else None)


class InflightLoadScorer(LinearScorer):
    """`inflight-load-scorer` (ours): the queue as it is *now*, not as the last scrape saw it.

    Effective queue = last scraped `waiting` + the picks this picker made to the endpoint since that scrape. Between
    two scrapes upstream's queue scorer sees the same numbers for every request, so a burst lands on whichever
    endpoint looked emptiest; counting our own picks makes the emptiest endpoint fill up in the score as it does in
    reality, and the burst spreads. Unknown `waiting` counts as the mean effective queue of the known candidates (an
    endpoint we cannot see is assumed typical, plus the picks we sent it); min-max as the queue scorer.

    With no candidate known (every endpoint's data unusable) there is no typical queue, and the picks since each
    scrape are no queue either: they count every pick since the data stopped, so one picked less while its data was
    still usable (held full by its last scrape) draws every request until its count catches up (a 16-endpoint pool
    stale 2 s: five critical requests in 0.11 s onto one engine). What the picker still sees live is its own prefill
    queued there (`Snapshot.prefill_tokens`: uncached prompt tokens of its picks not at their first byte yet,
    released at the first byte; this process's own, as a serving worker books it): that is the load a new
    request's prefill waits behind, so it is compared instead. Before the first scrape it spreads the first picks
    as the pick counts did, weighed by their prompts.
    Not our requests in flight: those count decodes the engine batches, and the endpoint whose decodes ended first
    then drew every request while its last picks still prefilled (4 × h100 all stale 1.10× → 1.52×).
    """

    type_name = "inflight-load-scorer"

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        load, bounds = state.signal(Signal.EFFECTIVE_QUEUE, candidates)  # shared with the filter: never written here
        if bounds[2]:
            snapshot = state.snapshot
            if bounds[0] != bounds[0]:  # nothing known: our prefill queued there
                load = np.asarray(state.take(snapshot.prefill_tokens, candidates), dtype=np.float64)
            else:  # unknown waiting counts as the known candidates' mean
                unknown = np.isnan(load)
                typical = float(load[~unknown].mean())
                picks = state.take(snapshot.picks_since_scrape, candidates)
                load = np.where(unknown, typical + picks, load)
            bounds = extremes(load)
        return lower_is_better(load, bounds)
