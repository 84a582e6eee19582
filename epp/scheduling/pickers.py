"""Pickers: from scored candidates to the slots to try, best first.

`maxNumOfEndpoints` > 1 returns fallbacks: the gateway retries the next address when the first fails. Randomness
comes from a numpy Generator seeded by the scheduler, so a benchmark or test run replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState
from epp.scheduling.totals import max_tie

_TIE = 1e-9  # scores closer than this are a tie (weighted sums of floats rarely compare exactly equal)


class SeededPicker:
    """What every picker here has: its names, how many slots it returns (`maxNumOfEndpoints`), its own RNG."""

    type_name: str

    def __init__(self, name: str | None = None, max_endpoints: int = 1, seed: int | None = None) -> None:
        self.name = name or self.type_name
        self.max_endpoints = max(1, max_endpoints)
        self._rng = np.random.default_rng(seed)  # vector draws (fallback orders, weights)
        self._draw = random.Random(seed).random  # one scalar draw: ~20× cheaper than Generator.integers


class MaxScorePicker(SeededPicker):
    """`max-score-picker`: highest total score; ties broken uniformly at random, so equal endpoints share load."""

    type_name = "max-score-picker"

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]:
        n = candidates.size
        if n == 0:
            return ()
        if self.max_endpoints == 1:
            return (candidates.item(max_tie(scores, _TIE, self._draw)),)  # the runner leaves no NaN in `scores`
        # Shuffle, then a stable sort by score: ties keep their random order.
        order = self._rng.permutation(n)
        order = order[np.argsort(-np.round(scores[order], 9), kind="stable")][: self.max_endpoints]
        return candidates[order].tolist()  # type: ignore[no-any-return]


class RandomPicker(SeededPicker):
    """`random-picker`: uniform among the candidates, ignoring scores."""

    type_name = "random-picker"

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]:
        n = candidates.size
        if n == 0:
            return ()
        if self.max_endpoints == 1:
            return (candidates.item(int(self._draw() * n)),)
        return candidates[self._rng.permutation(n)[: self.max_endpoints]].tolist()  # type: ignore[no-any-return]


class WeightedRandomPicker(SeededPicker):
    """`weighted-random-picker`: probability proportional to score, without replacement for fallbacks.

    Efraimidis–Spirakis keys (log u / w, largest first) give weighted sampling without replacement in one vector
    pass. All-zero scores fall back to uniform, so a pool nobody likes still gets a pick.
    """

    type_name = "weighted-random-picker"

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]:
        n = candidates.size
        if n == 0:
            return ()
        weights = scores if np.maximum.reduce(scores) > 0 else np.ones(n)
        # log(1 − u) with u in [0, 1) is finite or 0, never log(0); weight 0 → key −inf without a division.
        keys = np.full(n, -np.inf)
        np.divide(np.log1p(-self._rng.random(n)), weights, out=keys, where=weights > 0)
        if self.max_endpoints == 1:
            return (int(candidates[int(np.argmax(keys))]),)
        order = np.argsort(-keys, kind="stable")[: self.max_endpoints]
        return candidates[order].tolist()  # type: ignore[no-any-return]
