"""The profile runner: filters → weighted scorers → picker, then the plugins that learn from the pick.

`ProfileScheduler.pick` is the single-profile pick handler (`epp.scheduling.scheduler.PickHandler`). It is pure
apart from the plugins' own learned state (prefix index, session table, picker RNGs), takes `now` as an argument and
reads no clock, so the virtual-time benchmark drives exactly this code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import (
    CycleState,
    Filter,
    Linear,
    Picker,
    PickObserver,
    Producer,
    SchedulingRequest,
    Scorer,
    sanitize,
)
from epp.scheduling.fused import fused_default
from epp.scheduling.pick_detail import EMPTY, SCORED, TERMS, PickDetail, detail_of
from epp.scheduling.receipt import ReceiptReader
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.totals import weighted_total, weighted_total_rows


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class SchedulingProfile:
    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    observers: tuple[PickObserver, ...] = ()
    producers: tuple[Producer, ...] = ()  # run before the filters, in this order

    def describe(self) -> str:
        parts = [f"profile {self.name!r}:"]
        if self.producers:
            parts.append("producers " + ", ".join(p.name for p in self.producers) + ";")
        if self.filters:
            parts.append("filters " + ", ".join(f.name for f in self.filters) + ";")
        parts.append("scorers " + (", ".join(f"{s.scorer.name}×{s.weight:g}" for s in self.scorers) or "none") + ";")
        parts.append(f"picker {self.picker.name}")
        return " ".join(parts)


class PluginWrapper(Protocol):
    """Wraps one plugin method (extension point, plugin, bound method) into an equivalent callable, e.g. a timer."""

    every: int

    def timed(self, point: str, plugin: Any, method: Callable[..., Any]) -> Callable[..., Any]: ...


class ProfileScheduler:
    """Runs one scheduling profile (upstream's single-profile-handler) and carries the pool's saturation detector."""

    def __init__(self, profile: SchedulingProfile, saturation: SaturationDetector | None = None) -> None:
        self.profile = profile
        self.saturation = saturation or SaturationDetector()
        self.freshness = self.saturation.freshness  # the pool's one rule for usable data, shared with the detector
        self._filters = profile.filters
        self._scorers = tuple(
            (
                s.scorer.score,
                s.weight,
                bool(getattr(s.scorer, "UNIT_INTERVAL", False)),
                getattr(s.scorer, "linear", None),
                s.scorer,
            )
            for s in profile.scorers
            if s.weight > 0
        )
        self._picker = profile.picker
        # What a detailed pick's route receipt reads (`epp.scheduling.receipt`): the weighted scorers' terms, in order.
        self.receipts = ReceiptReader(
            profile.name,
            [s.scorer for s in profile.scorers],
            profile.producers,
            tuple(plugin.name for *_, plugin in self._scorers),
        )
        self._cached_blocks = tuple(
            s.scorer.cached_blocks for s in profile.scorers if hasattr(s.scorer, "cached_blocks")
        )
        self._observers = profile.observers
        self._producers = tuple(p.produce for p in profile.producers)
        # Upstream's ResponseHeaderProcessor: plugins that write a header on the response (session tokens).
        self._responders = tuple(
            s.scorer.response_headers for s in profile.scorers if hasattr(s.scorer, "response_headers")
        )
        self._plain = self._timed = (tuple(f.filter for f in self._filters), self._scorers, self._picker.pick)
        self._every = 0  # 0: never instrumented
        self._count = 0
        self._uniform: dict[tuple[int, float], FloatArray] = {}  # (candidates, offset) → read-only equal scores
        # The default profile's shape runs as one compiled call (`epp.scheduling.fused`) where it can; None else.
        self.fused = fused_default(
            profile.producers,
            profile.filters,
            [(s.scorer, s.weight) for s in profile.scorers],
            profile.picker,
            self.freshness,
        )

    def instrument(self, wrapper: PluginWrapper) -> None:
        """Run one pick in `wrapper.every` through wrapped plugin methods (per-plugin durations); the others, and
        the decisions of all, are unchanged: the same loop iterates the other tuple."""
        self._timed = (
            tuple(wrapper.timed("Filter", f, f.filter) for f in self._filters),
            tuple(
                (
                    wrapper.timed("Scorer", plugin, score),
                    w,
                    bounded,
                    wrapper.timed("Scorer", plugin, linear) if linear is not None else None,
                    plugin,
                )
                for score, w, bounded, linear, plugin in self._scorers
            ),
            wrapper.timed("Picker", self._picker, self._picker.pick),
        )
        self._every = max(1, wrapper.every)
        self.fused = None  # an instrumented pick times the plugins: they run

    @property
    def profiles(self) -> tuple[ProfileScheduler, ...]:
        return (self,)

    def describe(self) -> str:
        return self.profile.describe()

    @property
    def writes_response_headers(self) -> bool:
        """Whether any plugin writes a response header: the director asks `response_headers` per request only then."""
        return bool(self._responders)

    def _uniform_scores(self, size: int, offset: float) -> FloatArray:
        """`offset` for each of `size` candidates, built once per size: pickers only read their scores."""
        if len(self._uniform) >= 64:
            self._uniform.clear()
        scores = self._uniform[(size, offset)] = np.full(size, offset)
        scores.flags.writeable = False
        return scores

    def response_headers(self, snapshot: Snapshot, slot: int) -> tuple[tuple[str, str], ...]:
        """Headers the response to a request picked onto `slot` carries back to the client (none usually)."""
        if not self._responders:
            return ()
        return tuple(h for responder in self._responders for h in responder(snapshot, slot))

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float) -> Sequence[int]:
        """Slots best first (empty: a filter left no candidate). `candidates` are distinct present slots in
        ascending order, as the director builds them (`CycleState.take` relies on it to skip gathers)."""
        return self.run(snapshot, candidates, request, now)[0]

    def pick_detailed(
        self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float
    ) -> tuple[Sequence[int], PickDetail]:
        """`pick`, with the scores and the picked endpoint's cached prefix (`PickDetail`), for the director."""
        fused = self.fused
        started = None
        if fused is not None:  # `run`'s fused detailed run, inlined (its call cost ~2k instructions a receipt)
            started = CycleState(snapshot, candidates, request, now, self.freshness)
            picked = fused.run_detailed(started, candidates)
            if picked is not None:
                primary = picked[0]
                for observer in self._observers:
                    observer.picked(started, primary)
                scored, scores = started.scratch[SCORED]
                return picked, PickDetail(scored, scores, started, primary, self._cached_blocks)
        slots, state = self.run(snapshot, candidates, request, now, True, started)
        if not slots:
            return slots, EMPTY
        scored, scores = state.scratch[SCORED]  # `detail_of`, inlined: a detailed run keeps them
        return slots, PickDetail(scored, scores, state, int(slots[0]), self._cached_blocks)

    def detail(self, state: CycleState, primary: int) -> PickDetail:
        """The PickDetail of a run of this profile whose primary slot is `primary`."""
        return detail_of(state, primary, self._cached_blocks)

    def run(
        self,
        snapshot: Snapshot,
        candidates: IntArray,
        request: SchedulingRequest,
        now: float,
        detailed: bool = False,
        started: CycleState | None = None,
    ) -> tuple[Sequence[int], CycleState]:
        """`pick`, with the pick's state (what its producers published): a profile handler's deciders read it;
        `detailed` also keeps the scored candidates and totals in it, for `detail`; `started`: the state of a fused
        run that answered None (`pick_detailed`), on which the plugins run (what its prefix lookup kept included)."""
        if started is None:
            state = CycleState(snapshot, candidates, request, now, self.freshness)
            if self.fused is not None:
                fused = self.fused.run_detailed(state, candidates) if detailed else self.fused.run(state, candidates)
                if fused is not None:
                    for observer in self._observers:
                        observer.picked(state, fused[0])
                    return fused, state
        else:
            state = started
        filters, scorers, pick = self._plain
        if self._every:
            self._count += 1
            if self._count >= self._every:
                self._count = 0
                filters, scorers, pick = self._timed
        for produce in self._producers:
            produce(state)
        for run_filter in filters:
            candidates = run_filter(state, candidates)
            if candidates.size == 0:
                return (), state
        offset = 0.0  # the linear scorers' constant parts, added once at the end
        flat: list[object] = []  # each per-candidate term's values, coef, fill (`weighted_total`)
        # A detailed run keeps each scorer's weighted term (None: the same everywhere) and constant part: the
        # receipt's contributions (`epp.scheduling.receipt`), the terms written out by the pass that sums them
        # (`weighted_total_rows`). The common run pays one test per scorer.
        named: list[tuple[str, bool, float]] | None = [] if detailed else None  # (scorer, has a term, constant)
        for score, weight, bounded, linear, plugin in scorers:
            if linear is not None:
                form: Linear = linear(state, candidates)
                offset += weight * form.offset
                part = form.part(weight)
                if named is not None:
                    named.append((plugin.name, part is not None, weight * form.offset))
                if part is None:
                    continue
                flat += part
            else:
                scores = score(state, candidates)
                if not bounded:
                    scores = sanitize(np.array(scores, dtype=np.float64))
                scores *= weight
                if named is not None:
                    named.append((plugin.name, True, 0.0))
                flat += (scores, 1.0, None)
        rows: FloatArray | None = None
        if flat:
            if named is None:
                total = weighted_total(flat, offset, candidates.size)
            else:
                total, rows = weighted_total_rows(flat, offset, candidates.size)
        else:  # no per-candidate term (a random-picker profile): the same scores every pick
            uniform = self._uniform.get((candidates.size, offset))
            total = uniform if uniform is not None else self._uniform_scores(candidates.size, offset)
        if named is not None:
            state.scratch[SCORED] = (candidates, total)  # for `detail`: the scores
            state.scratch[TERMS] = (named, rows)  # for the receipt: each scorer's row of `rows` in turn
        slots = pick(state, candidates, total)
        if slots:
            primary = int(slots[0])
            for observer in self._observers:
                observer.picked(state, primary)
        return slots, state
