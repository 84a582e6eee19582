"""What a pick knew beyond its slots, for the director's two uses of it (upstream's ProfileRunResult fields):

- the weighted score of every endpoint the primary profile scored (`--emit-endpoint-scores`: upstream's
  `ScoredCandidates`, every candidate its filters kept, not only the ones picked);
- how many leading prompt blocks the picked endpoint already holds by the prefix producers' reckoning, or by a
  `prefix-cache-scorer` that matches by itself (`Prefer: if-available`: upstream reads the picked endpoint's
  PrefixCacheMatchInfo);
- the pick's state, with each scorer's weighted term under `TERMS`: what a route receipt is made of
  (`epp.scheduling.receipt`).

The profile runner stores its candidates and totals in the pick's state under `SCORED` only for a detailed run
(the director asks for one only then: the common path pays one flag test); `detail_of` reads them back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, PrefixMatch

SCORED = "pick-detail/scored"  # scratch key: (candidates after the filters, their weighted totals)
# Scratch key: ([(scorer, has a per-candidate term, constant part)], the terms: one row per scorer that has one, a
# column per scored candidate, or None).
TERMS = "pick-detail/terms"
# Scratch key, where a runner keeps them so (the fused pick's views, built once per shape of detail): `SCORED`'s and
# `TERMS`' arrays as memoryviews, (candidates, totals, rows or None). The compiled readers (the receipt, the scores'
# pairs) take a memoryview's buffer for a fraction of numpy's export of an array's (~800 instructions each).
BUFFERS = "pick-detail/buffers"


# A scorer's own prefix match for this pick: (state, slot) → leading blocks held (`PrefixCacheScorer.cached_blocks`).
CachedBlocks = Callable[[CycleState, int], int]


class PickDetail:
    """A detailed pick's scores and state; its `cached_blocks` read when asked (only `Prefer: if-available` does:
    a pick detailed for its scores or receipt pays no prefix lookup of its own)."""

    __slots__ = ("_blocks", "_primary", "_scorers", "scored", "scores", "state")

    def __init__(
        self,
        scored: IntArray,
        scores: FloatArray,
        state: CycleState | None = None,
        primary: int = -1,
        scorers: tuple[CachedBlocks, ...] = (),
    ) -> None:
        self.scored = scored  # the slots the primary profile scored (its filters' survivors)
        self.scores = scores  # their weighted scores (upstream's sum of clamped score × weight), one per slot
        self.state = state  # the primary profile's pick state: what a route receipt reads
        self._primary = primary
        self._scorers = scorers
        self._blocks = -1  # not read yet

    @property
    def cached_blocks(self) -> int:
        """Leading prompt blocks the picked endpoint holds (0: none, or no prefix producer ran)."""
        if self._blocks < 0:
            state = self.state
            self._blocks = cached_blocks(state, self._primary, self._scorers) if state is not None else 0
        return self._blocks


EMPTY = PickDetail(np.zeros(0, dtype=np.int64), np.zeros(0))


def cached_blocks(state: CycleState, primary: int, scorers: tuple[CachedBlocks, ...]) -> int:
    """How many leading prompt blocks `primary` holds by the profile's scorers that match prefixes themselves
    (`scorers`) and by any prefix producer's match in the pick's state."""
    blocks = max((held(state, primary) for held in scorers), default=0)
    for value in state.scratch.values():
        # Any prefix producer's match counts (a tiered config runs one per tier): the most blocks wins.
        if isinstance(value, PrefixMatch) and value.total > 0 and 0 <= primary < value.matched.size:
            blocks = max(blocks, int(value.matched[primary]))
    return blocks


def detail_of(state: CycleState, primary: int, scorers: tuple[CachedBlocks, ...] = ()) -> PickDetail:
    """The detail of a pick whose primary (first) slot is `primary`, from its state and the profile's scorers
    that match prefixes themselves."""
    scored, scores = state.scratch.get(SCORED, _UNSCORED)
    return PickDetail(scored, scores, state, primary, scorers)


_UNSCORED = (EMPTY.scored, EMPTY.scores)
