"""Upstream's SLO-aware routing types on the picker's own latency model (`epp.scheduling.latency_model`), no sidecar:

- `predicted-latency-producer`: per candidate, predicted TTFT and TPOT (ms) for this request (its uncached prompt
  tokens by the prefix producer it names, the endpoint's queue, running, KV use and our in-flight), and the
  headroom against the request's `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (× `sloBufferFactor`); it learns
  from every routed request (`observe`: the observation feed) and notes each pick's uncached tokens for it.
- `slo-headroom-tier-filter`: candidates that meet both SLOs, else those that do not; with both tiers, the
  violating one `epsilonExploreNeg` of the time (so a recovering endpoint is seen again); no prediction: all kept.
- `latency-scorer`: headroom-based score (upstream's rules: only the positive tier scored when mixed; all negative →
  idle endpoints first, then the least severe deficit bucket; `least` packs close to the SLO, `most` keeps margin;
  without an SLO the lowest predicted latency wins).
- `latency-slo-admitter` (`PredictiveSloAdmitter`): a sheddable request with an SLO is refused when no candidate is
  idle, cold, or predicted to meet its SLO (uncached tokens taken as 0: a lower bound, so a refusal is sure).

Parameters that configure upstream's sidecars (training/prediction URLs, sample counts) are accepted and noted as
not needed. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.observations import Observation
from epp.datastore.table import FloatArray, IntArray
from epp.flowcontrol.admission import COLD_KV, LatencySloAdmitter
from epp.flowcontrol.types import QueuedRequest
from epp.scheduling.framework import CycleState, PrefixMatch, Signal, produced, publish, sanitize
from epp.scheduling.latency_model import LatencyModel, features
from epp.scheduling.producers import tokenized

TYPE = "predicted-latency-producer"


class LatencyPrediction(NamedTuple):
    """Upstream's LatencyPredictionInfo for every candidate of one pick (arrays aligned with `candidates`)."""

    candidates: IntArray
    ttft_ms: FloatArray
    tpot_ms: FloatArray
    ttft_headroom: FloatArray  # SLO − predicted (no SLO: −predicted, as upstream)
    tpot_headroom: FloatArray
    dispatched: IntArray  # our requests in flight per candidate

    def valid(self) -> np.ndarray:
        return (self.ttft_headroom >= 0) & (self.tpot_headroom >= 0)


def _slo(request: object, field: str) -> float:
    value = getattr(request, field, None)
    return float(value) if value is not None and value > 0 else math.nan


class PredictedLatencyProducer:
    ORDER: ClassVar[int] = 20  # after the token (0) and prefix (5, 10) producers
    type_name = TYPE

    def __init__(self, name: str, model: LatencyModel, buffer: float = 1.0, prefix_producer: str = "") -> None:
        self.name = name
        self.model = model
        self.buffer = buffer
        self.prefix_producer = prefix_producer

    def _uncached(self, state: CycleState, candidates: IntArray, prompt: int) -> FloatArray:
        match: PrefixMatch | None = produced(state, self.prefix_producer) if self.prefix_producer else None
        if match is None:
            for value in state.scratch.values():  # any prefix producer's match (the most blocks held)
                if isinstance(value, PrefixMatch) and (match is None or value.total > match.total):
                    match = value
        if match is None or match.total <= 0 or match.matched.size == 0:
            return np.full(candidates.size, float(prompt))
        out: FloatArray = state.take(match.matched, candidates) * -float(match.block_tokens)  # a new float array
        out += prompt
        return np.fmax(out, 0.0, out=out)

    def prediction(self, state: CycleState, candidates: IntArray) -> LatencyPrediction:
        prompt = tokenized(state).n_tokens
        uncached = self._uncached(state, candidates, prompt)
        queue, _ = state.signal(Signal.EFFECTIVE_QUEUE, candidates)  # the queue scorer's too: computed once
        kv, _ = state.signal(Signal.KV_USAGE, candidates)
        snapshot = state.snapshot
        running = state.take(snapshot.running, candidates)  # no extremes: no scorer of ours reads it
        mask = state.usable(candidates)
        if mask is not None:
            running = np.where(mask, running, 0.0)
        inflight = state.take(snapshot.inflight, candidates)
        held = state.take(snapshot.inflight_tokens, candidates)
        ttft, tpot = self.model.predict(candidates, features(uncached, queue, running, kv, inflight, held))
        ttft_slo = _slo(state.request, "slo_ttft_ms") * self.buffer
        tpot_slo = _slo(state.request, "slo_tpot_ms") * self.buffer
        has_ttft, has_tpot = ttft_slo == ttft_slo, tpot_slo == tpot_slo
        if has_ttft and not has_tpot:
            ttft_room, tpot_room = ttft_slo - ttft, np.zeros(candidates.size)  # TPOT does not decide the tier
        elif has_tpot and not has_ttft:
            ttft_room, tpot_room = np.zeros(candidates.size), tpot_slo - tpot
        else:
            ttft_room = (ttft_slo - ttft) if has_ttft else -ttft
            tpot_room = (tpot_slo - tpot) if has_tpot else -tpot
        state.scratch[_UNCACHED] = (candidates, uncached)
        return LatencyPrediction(candidates, ttft, tpot, ttft_room, tpot_room, inflight)

    def produce(self, state: CycleState) -> None:
        if self.model.observations == 0:
            return  # nothing learned yet: no prediction (consumers fall back, as upstream without its sidecar)
        publish(state, self.name, self.prediction(state, state.candidates))

    def picked(self, state: CycleState, slot: int) -> None:
        cached = state.scratch.get(_UNCACHED)
        if cached is None:
            prompt = tokenized(state).n_tokens
            self.model.note_pick(slot, int(self._uncached(state, np.array([slot]), prompt)[0]))
            return
        candidates, uncached = cached
        if slot < candidates.size and candidates[slot] == slot:  # candidates 0..n-1 (a whole table): no search
            self.model.note_pick(slot, int(uncached[slot]))
            return
        where = np.flatnonzero(candidates == slot)
        if where.size:
            self.model.note_pick(slot, int(uncached[where[0]]))

    def observe(self, obs: Observation) -> None:
        self.model.observe(obs)


_UNCACHED = "predicted-latency/uncached"


def prediction_of(state: CycleState, producer: str, candidates: IntArray) -> LatencyPrediction | None:
    """The named producer's prediction over `candidates` (a filter may have narrowed them), or None."""
    found: LatencyPrediction | None = produced(state, producer)
    if found is None:
        return None
    if found.candidates is candidates or np.array_equal(found.candidates, candidates):
        return found
    index = np.searchsorted(found.candidates, candidates)
    return LatencyPrediction(candidates, *(column[index] for column in found[1:]))  # type: ignore[arg-type]


class HeadroomTierFilter:
    type_name = "slo-headroom-tier-filter"

    def __init__(
        self, name: str, producer: str, epsilon: float, seed: int, speed_tiers: LatencyModel | None = None
    ) -> None:
        self.name = name
        self.producer = producer
        self.epsilon = epsilon
        self.speed_tiers = speed_tiers  # the producer's model: `speedTiers` on
        self._rng = np.random.default_rng(seed)

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        found = prediction_of(state, self.producer, candidates)
        if found is None:
            return candidates
        valid = found.valid()
        if not bool(valid.any()):
            return candidates
        model = self.speed_tiers
        if bool(valid.all()):
            return self._slowest(state, candidates, model) if model is not None else candidates
        if self._rng.random() < self.epsilon:
            explored: IntArray = candidates[~valid]
            return explored
        kept: IntArray = candidates[valid]
        return self._slowest(state, kept, model) if model is not None else kept

    @staticmethod
    def _slowest(state: CycleState, kept: IntArray, model: LatencyModel) -> IntArray:
        """`speedTiers`: of the candidates that meet the request's SLO, those of the slowest hardware class that
        can meet it (a class: the endpoints of one KV capacity, engine metadata; its speed: the class's learned
        TTFT of this prompt on an idle endpoint, which must be within the SLO), so a loose objective leaves the
        fast endpoints' headroom to the tight ones. A class that stops meeting the SLO (saturated) leaves the tier
        by itself: no threshold. Candidates of a class not learned yet stay in the tier kept; fewer than two
        classes learned, or none that can meet the SLO: the tier as it is."""
        if kept.size < 2:
            return kept
        snapshot = state.snapshot
        capacity = snapshot.num_blocks[kept] * snapshot.block_size[kept]
        classes, which = np.unique(capacity, return_inverse=True)
        if classes.size < 2:
            return kept
        speed = model.unloaded_ttft(classes, tokenized(state).n_tokens)
        known = speed == speed
        if int(np.count_nonzero(known)) < 2:
            return kept
        slo = _slo(state.request, "slo_ttft_ms")
        able = known & (speed <= slo) if slo == slo else known
        if not bool(able.any()):
            return kept
        slowest = int(np.argmax(np.where(able, speed, -np.inf)))
        keep = (which == slowest) | ~known[which]
        chosen: IntArray = kept[keep]
        return chosen


def _normalised(values: FloatArray) -> FloatArray:
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 0:
        return np.zeros_like(values)
    return (values - lo) / (hi - lo)


class LatencyScorer:
    type_name = "latency-scorer"
    UNIT_INTERVAL = True

    def __init__(
        self,
        name: str,
        producer: str,
        ttft_weight: float,
        tpot_weight: float,
        most: bool,
        composite: tuple[float, float, float] = (1.0, 1.0, 1.0),
    ) -> None:
        self.name = name
        self.producer = producer
        self.ttft_weight, self.tpot_weight = ttft_weight, tpot_weight
        self.most = most
        self.composite = composite  # KV, queue, prefix weights of the fallback without predictions

    def _composite(self, state: CycleState, candidates: IntArray) -> FloatArray:
        """Upstream's fallback while no prediction exists (before the first observation): free KV, a short queue
        and a cached prefix, weighted; an unknown signal is neutral (0.5)."""
        w_kv, w_queue, w_prefix = self.composite
        kv, _ = state.signal(Signal.KV_USAGE, candidates)
        queue, (lo, hi, _) = state.signal(Signal.EFFECTIVE_QUEUE, candidates)
        free = np.nan_to_num(1.0 - kv, nan=0.5)
        short = np.nan_to_num(1.0 - (queue - lo) / (hi - lo), nan=0.5) if hi > lo else np.full(candidates.size, 1.0)
        prefix = np.zeros(candidates.size)
        for value in state.scratch.values():
            if isinstance(value, PrefixMatch):
                prefix = np.fmax(prefix, value.ratio(state, candidates))
        total = w_kv + w_queue + w_prefix
        if total <= 0:
            return np.zeros(candidates.size)
        out: FloatArray = (w_kv * free + w_queue * short + w_prefix * prefix) / total
        return sanitize(out)  # a KV use above 1 (an engine's own rounding) must not score below 0

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        found = prediction_of(state, self.producer, candidates)
        if found is None:
            return self._composite(state, candidates)
        out = np.zeros(candidates.size)
        ttft, tpot = found.ttft_headroom, found.tpot_headroom
        positive = (ttft >= 0) & (tpot >= 0)
        if bool(positive.any()):
            chosen = positive
            most = self.most
        else:  # every candidate misses: idle ones first, then the least severe deficit bucket
            most = False
            idle = found.dispatched == 0
            if bool(idle.any()):
                chosen = idle
            else:
                buckets = ((ttft >= 0) & (tpot < 0), (ttft < 0) & (tpot >= 0), (ttft < 0) & (tpot < 0))
                chosen = next(b for b in buckets if bool(b.any()))
        t, p = ttft[chosen], tpot[chosen]
        wt, wp = self.ttft_weight, self.tpot_weight
        if float(t.max() - t.min()) <= 0:
            wt, wp = 0.0, 1.0
        elif float(p.max() - p.min()) <= 0:
            wt, wp = 1.0, 0.0
        total = wt + wp
        if total <= 0:
            out[chosen] = 1.0
            return out
        nt, np_ = _normalised(t), _normalised(p)
        if not most and bool(positive.any()):  # `least`: the smallest headroom that meets the SLO
            nt, np_ = 1.0 - nt, 1.0 - np_
        out[chosen] = (wt * nt + wp * np_) / total
        return sanitize(out)


class PredictiveSloAdmitter:
    """`latency-slo-admitter` over the latency model (flow control's Admitter protocol)."""

    def __init__(self, name: str, producer: PredictedLatencyProducer | None) -> None:
        self.name = name
        self.producer = producer
        self._unlearned = LatencySloAdmitter(name)  # before the first observation: the queue's own evidence

    def admit(
        self,
        item: QueuedRequest,
        snapshot: Snapshot,
        candidates: IntArray,
        now: float,
        draw: float,
        oldest_wait_s: float,
    ) -> bool:
        if item.priority >= 0 or candidates.size == 0 or item.slo_ttft_s is None or item.slo_ttft_s <= 0:
            return True
        producer = self.producer
        if producer is None or producer.model.observations == 0:
            return self._unlearned.admit(item, snapshot, candidates, now, draw, oldest_wait_s)
        if bool(np.any(snapshot.inflight[candidates] == 0)):
            return True  # hasIdle
        if bool(np.any(snapshot.kv_usage[candidates] < COLD_KV)):
            return True  # hasCold (NaN compares False)
        queue = (snapshot.waiting + snapshot.picks_since_scrape)[candidates]
        x = features(
            np.zeros(candidates.size),
            queue,
            snapshot.running[candidates],
            snapshot.kv_usage[candidates],
            snapshot.inflight[candidates],
            snapshot.inflight_tokens[candidates],
        )
        ttft, _ = producer.model.predict(candidates, x)
        waited_ms = max(0.0, now - item.received_at) * 1000.0
        return bool(np.any(ttft + waited_ms <= item.slo_ttft_s * 1000.0 * producer.buffer))
