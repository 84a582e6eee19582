"""Upstream's producer-fed scorers: prefix match from a producer, load-aware, active-request, token-load, no-hit-LRU,
and context-length-aware (a scorer that can also filter).

Each reads what a producer published for the pick (`framework.produced`), by the producer name its parameters give,
and falls back to what upstream's auto-created default producer would give when none is configured. Formulas are
upstream's (llm-d-router `pkg/epp/framework/plugins/scheduling/scorer/...`), vectorised over the candidates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, Linear, LinearScorer, PrefixMatch, Signal, produced
from epp.scheduling.producers import inflight_load, tokenized

NEUTRAL = 0.5


def prefix_match(state: CycleState, producer: str) -> PrefixMatch | None:
    return produced(state, producer)  # type: ignore[no-any-return]


class ProducedPrefixScorer(LinearScorer):
    """`prefix-cache-scorer` fed by a producer (`prefixMatchInfoProducerName`): upstream's current form.

    score = w · min(1, matched blocks × block tokens / matchLengthScaleTokens)² + (1 − w) · matched / total blocks,
    w = matchLengthWeight (default 0: the match ratio alone). No data or a prompt without a whole block: 0.
    """

    type_name = "prefix-cache-scorer"

    def __init__(self, name: str, producer: str, length_weight: float = 0.0, scale_tokens: int = 0) -> None:
        super().__init__(name)
        self.producer = producer
        self.length_weight = length_weight
        self.scale_tokens = scale_tokens

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        match = prefix_match(state, self.producer)
        if match is None or match.total <= 0 or match.matched.size == 0:
            return Linear(None, 0.0, 0.0)
        matched = np.asarray(state.take(match.matched, candidates), dtype=np.float64)
        w = self.length_weight
        if w <= 0.0 or match.block_tokens <= 0:
            return Linear(matched, 1.0 / match.total, 0.0)
        length = np.minimum(1.0, matched * (match.block_tokens / self.scale_tokens))
        return Linear(w * length * length + (1.0 - w) * matched / match.total, 1.0, 0.0)


class LoadAwareScorer(LinearScorer):
    """`load-aware-scorer`: empty queue 0.5, falling linearly to 0 at `threshold` waiting requests (default 128);
    upstream's `scorer/loadaware/load_aware.go`. Unknown queue (no usable scrape): 0.25, the middle of that range."""

    type_name = "load-aware-scorer"

    def __init__(self, name: str = "load-aware-scorer", threshold: int = 128) -> None:
        super().__init__(name)
        self.threshold = float(threshold)

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        waiting, (lo, hi, unknown) = state.signal(Signal.WAITING, candidates)
        if hi > self.threshold or lo < 0.0:
            waiting = np.clip(waiting, 0.0, self.threshold)
        return Linear(waiting, -0.5 / self.threshold, 0.5, 0.25 if unknown else None)


class ActiveRequestScorer:
    """`active-request-scorer`: this picker's in-flight requests per endpoint (from the in-flight producer);
    count ≤ idleThreshold (0) scores 1.0, others (max − count) / max × maxBusyScore (1.0); upstream's
    `scorer/activerequest/active_request.go`."""

    type_name = "active-request-scorer"
    UNIT_INTERVAL = True

    def __init__(
        self, name: str = "active-request-scorer", idle: int = 0, max_busy: float = 1.0, producer: str = ""
    ) -> None:
        self.name = name
        self.idle = idle
        self.max_busy = max_busy
        self.producer = producer or "inflight-load-producer"

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        counts = np.asarray(state.take(inflight_load(state, self.producer).requests, candidates), dtype=np.float64)
        top = float(counts.max()) if counts.size else 0.0
        out = np.ones(candidates.size)
        if top > 0:
            busy = counts > self.idle
            out[busy] = (top - counts[busy]) / top * self.max_busy
        return out


class TokenLoadScorer:
    """`token-load-scorer`: 1 − min(tokens, queueThresholdTokens) / queueThresholdTokens (default 4,194,304), where
    tokens = prompt tokens in flight there + this request's tokens not already cached there (its prompt minus the
    prefix the named prefix producer finds on that endpoint); upstream's `scorer/tokenload/token_load.go`."""

    type_name = "token-load-scorer"
    UNIT_INTERVAL = True

    def __init__(
        self, name: str = "token-load-scorer", threshold: int = 4_194_304, producer: str = "", prefix_producer: str = ""
    ) -> None:
        self.name = name
        self.threshold = float(threshold)
        self.producer = producer or "inflight-load-producer"
        # Optional: without a prefix producer of that name the whole prompt counts as uncached.
        self.optional_prefix_producer = prefix_producer or "approx-prefix-cache-producer"

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        load = inflight_load(state, self.producer)
        tokens = np.asarray(state.take(load.tokens, candidates), dtype=np.float64) + load.request_tokens
        match = prefix_match(state, self.optional_prefix_producer)
        if match is not None and match.total > 0 and match.matched.size:
            cached = np.asarray(state.take(match.matched, candidates), dtype=np.float64) * match.block_tokens
            tokens -= np.minimum(cached, float(load.request_tokens))
        return np.asarray(1.0 - np.minimum(np.maximum(tokens, 0.0), self.threshold) / self.threshold)


class PrefillQueueScorer:
    """`prefill-queue-scorer` (ours): the wait before this request's first token, in prompt tokens, from the
    picker's own observations: the uncached prompt tokens of this picker's requests on the endpoint that have not
    had their first byte yet (`Snapshot.prefill_tokens`: booked at the pick, released at the first byte) plus
    this request's own tokens not cached there (its prompt minus the prefix the named prefix producer finds).
    One unit for both, so a cached prefix weighs against a queue exactly: an idle endpoint that must recompute
    6k tokens loses to one holding them with less than 6k tokens of prefill queued. score = least wait / wait
    (1 for the shortest wait). Notes the pick's uncached tokens (`uncached`) for the director's booking."""

    type_name = "prefill-queue-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "prefill-queue-scorer", prefix_producer: str = "") -> None:
        self.name = name
        self.optional_prefix_producer = prefix_producer or "approx-prefix-cache-producer"
        self._noted: dict[int, int] = {}  # slot → uncached tokens of its last pick (the director asks once)
        self._key = f"prefill-queue:{name}"

    def _own(self, state: CycleState, candidates: IntArray) -> FloatArray:
        """This request's uncached prompt tokens on each candidate."""
        prompt = float(tokenized(state).n_tokens)
        match = prefix_match(state, self.optional_prefix_producer)
        if match is None or match.total <= 0 or not match.matched.size:
            return np.full(candidates.size, prompt)
        cached = np.asarray(state.take(match.matched, candidates), dtype=np.float64) * match.block_tokens
        return np.asarray(prompt - np.minimum(cached, prompt))

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        own = self._own(state, candidates)
        state.scratch[self._key] = (candidates, own)
        wait = np.asarray(state.take(state.snapshot.prefill_tokens, candidates), dtype=np.float64) + own
        np.fmax(wait, 1.0, out=wait)
        return np.asarray(wait.min() / wait)

    def picked(self, state: CycleState, slot: int) -> None:
        cached = state.scratch.get(self._key)
        if cached is None:
            return
        candidates, own = cached
        where = np.flatnonzero(candidates == slot)
        if where.size:
            self._noted[slot] = int(own[where[0]])

    def uncached(self, slot: int, prompt_tokens: int) -> int:
        """`Scheduler.uncached`: this pick's uncached tokens on `slot` as scored, else every prompt token."""
        return self._noted.pop(slot, prompt_tokens)


class NoHitLruScorer:
    """`no-hit-lru-scorer`: for a cold request (no endpoint holds any of its prefix), endpoints that never took a
    cold request score highest, then the least recently used for one; a warm request scores 0.5 everywhere.
    Rank r (never-used first, then oldest) scores 1 − r / (n − 1); the LRU keeps `lruSize` (1024) endpoints;
    upstream's `scorer/nohitlru/no_hit_lru.go`."""

    type_name = "no-hit-lru-scorer"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "no-hit-lru-scorer", lru_size: int = 1024, producer: str = "") -> None:
        self.name = name
        self.lru_size = lru_size
        self.producer = producer or "approx-prefix-cache-producer"
        self._lru: OrderedDict[str, None] = OrderedDict()  # oldest first
        self._key = f"no-hit-lru:{name}"

    def _cold(self, state: CycleState) -> bool:
        cold = state.scratch.get(self._key)
        if cold is None:
            match = prefix_match(state, self.producer)
            cold = state.scratch[self._key] = match is None or not match.any_hit()
        return bool(cold)

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        n = candidates.size
        if not self._cold(state):
            return np.full(n, NEUTRAL)
        if n == 1:
            return np.ones(1)
        addresses = state.snapshot.addresses
        position = {address: i for i, address in enumerate(self._lru)}
        names = [addresses[int(s)] for s in candidates]
        never = [i for i, a in enumerate(names) if a not in position]
        out = np.zeros(n)
        for rank, i in enumerate(never):
            out[i] = 1.0 - rank / (n - 1)
        for i, a in enumerate(names):
            if a in position:
                out[i] = max(0.0, 1.0 - (len(never) + position[a]) / (n - 1))
        return out

    def picked(self, state: CycleState, slot: int) -> None:
        if not self._cold(state):
            return
        address = state.snapshot.addresses[slot]
        self._lru.pop(address, None)
        self._lru[address] = None
        while len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)


CONTEXT_LENGTH_LABEL = "llm-d.ai/context-length-range"
_MAX_FALLBACK = 0.3


def parse_range(value: str) -> tuple[int, int] | None:
    """A "min-max" label value; None when malformed (min > max, not two integers)."""
    low, sep, high = value.partition("-")
    if not sep or "-" in high:
        return None
    try:
        lo, hi = int(low.strip()), int(high.strip())
    except ValueError:
        return None
    return (lo, hi) if lo <= hi else None


def range_score(tokens: int, bounds: tuple[int, int]) -> float:
    """Upstream's `calculateRangeScore`: in range (0.3, 1] (tighter ranges and more headroom higher), out of range
    [0, 0.3) by distance to the nearest bound."""
    lo, hi = bounds
    if lo <= tokens <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        raw = 0.7 / (1.0 + width / 10000.0) + 0.3 * (hi - tokens) / width
        return _MAX_FALLBACK + raw * (1.0 - _MAX_FALLBACK)
    distance = tokens - hi if tokens > hi else lo - tokens
    return _MAX_FALLBACK / (1.0 + distance / 1000.0)


class ContextLengthAware:
    """`context-length-aware`: scores endpoints by how well their `label` range ("min-max" tokens) fits the
    request's token count (from the token producer; the estimate when none); unlabelled 0.5, malformed 0. With
    `enableFiltering` it also drops labelled endpoints whose range excludes the request (malformed labels too;
    unlabelled ones are kept); upstream's `scorer/contextlengthaware/context_length_aware.go`."""

    type_name = "context-length-aware"
    UNIT_INTERVAL = True

    def __init__(self, name: str = "context-length-aware", label: str = CONTEXT_LENGTH_LABEL, filtering: bool = False):
        self.name = name
        self.label = label
        self.also_filters = filtering
        self._version = -1
        self._ranges: list[tuple[int, int] | bool | None] = []  # per slot: range, None malformed, False unlabelled

    def _slot_ranges(self, snapshot: Snapshot) -> list[tuple[int, int] | bool | None]:
        if snapshot.version != self._version or len(self._ranges) != len(snapshot.infos):
            ranges: list[tuple[int, int] | bool | None] = []
            for info in snapshot.infos:
                labels: Mapping[str, str] = info.labels if info is not None else {}
                value = labels.get(self.label)
                ranges.append(False if value is None else parse_range(value))
            self._ranges = ranges
            self._version = snapshot.version
        return self._ranges

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        tokens = tokenized(state).n_tokens
        ranges = self._slot_ranges(state.snapshot)
        out = np.empty(candidates.size)
        for i, slot in enumerate(candidates.tolist()):
            r = ranges[slot]
            out[i] = NEUTRAL if r is False else 0.0 if r is None or r is True else range_score(tokens, r)
        return out

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        if not self.also_filters:
            return candidates
        tokens = tokenized(state).n_tokens
        ranges = self._slot_ranges(state.snapshot)
        keep = [
            r is False or (isinstance(r, tuple) and r[0] <= tokens <= r[1]) for r in (ranges[s] for s in candidates)
        ]
        return candidates[np.fromiter(keep, dtype=np.bool_, count=candidates.size)]
