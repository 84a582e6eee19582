"""The four extension points of a scheduling profile (upstream's words) and the per-pick state they share.

A pick runs filters → scorers → picker over *candidate slots* of one endpoint-table snapshot. Every plugin works on
whole numpy columns indexed by the candidate array, so a pick costs a fixed number of vector operations whatever the
pool size. `CycleState` carries what one pick computes once and several plugins read (the prompt's block hashes),
so a 128 KB prompt is hashed once per pick, not once per plugin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray


class SchedulingRequest(Protocol):
    """What scheduling reads of a request. Declared here, not imported: the request parser sits in a layer above
    (epp.requests), and `epp.requests.InferenceRequest` satisfies this structurally."""

    @property
    def model(self) -> str: ...

    @property
    def prompt(self) -> str: ...

    @property
    def session_token(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


# Up to this many candidates, per-pick reductions and passes run on Python lists: a numpy call costs thousands of
# instructions of dispatch, more than the arithmetic of a few dozen values (CycleState.extreme, the saturation
# filter's exact pass, the max-score picker's tie search).
SMALL_POOL = 32


class CycleState:
    """One pick's inputs plus a scratch dict for values computed once per pick (e.g. prompt block hashes)."""

    __slots__ = ("_extremes", "_whole", "candidates", "now", "request", "scratch", "snapshot")

    def __init__(self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float) -> None:
        self.snapshot = snapshot
        self.candidates = candidates
        self.request = request
        self.now = now
        self.scratch: dict[str, Any] = {}
        # Candidates are distinct present slots in ascending order; as many as the snapshot has slots means every
        # slot, in order, so a column can be used as is instead of gathered (the common case: no subset hint, no
        # free slots).
        self._whole = candidates.size == snapshot.present.size
        self._extremes: dict[str, tuple[IntArray, float, float]] = {}  # column → (candidates, min, max)

    def effective_queue(self) -> FloatArray:
        """Per slot, last scraped `waiting` + own picks since that scrape (NaN where waiting is unknown).

        Computed once per pick over the whole table and shared by the saturation filter and the in-flight scorer.
        """
        queue: FloatArray | None = self.scratch.get("effective_queue")
        if queue is None:
            queue = self.snapshot.waiting + self.snapshot.picks_since_scrape
            self.scratch["effective_queue"] = queue
        return queue

    def bounds(self, name: str, candidates: IntArray) -> tuple[float, float]:
        """(min, max) of a snapshot column (or "effective_queue") over `candidates`; NaN if any value is NaN."""
        return self.extreme(name, candidates, False), self.extreme(name, candidates, True)

    def extreme(self, name: str, candidates: IntArray, highest: bool) -> float:
        """The max (or min) of a snapshot column (or "effective_queue") over `candidates`; NaN if any is NaN.

        Several plugins of one pick need the same extremes (the saturation filter's thresholds, the scorers'
        min-max normalisation), so each is computed once per pick. For a pool of a few dozen endpoints a numpy
        reduction costs thousands of instructions of dispatch for a handful of comparisons, so small columns are
        reduced as a Python list, both extremes in one pass, unless a NaN is present (its sum is NaN then).
        """
        cached = self._extremes.get(name)
        if cached is not None and cached[0] is candidates:
            return cached[2] if highest else cached[1]
        column = self.effective_queue() if name == "effective_queue" else getattr(self.snapshot, name)
        values = self.take(column, candidates)
        if values.size <= SMALL_POOL:
            listed: list[float] = values.tolist()
            total = sum(listed)
            if total == total and listed:  # no NaN (an inf − inf sum also goes to numpy, which gets it right)
                lo, hi = min(listed), max(listed)
                self._extremes[name] = (candidates, lo, hi)
                return hi if highest else lo
        if not values.size:
            return math.nan
        lo, hi = float(np.minimum.reduce(values)), float(np.maximum.reduce(values))
        self._extremes[name] = (candidates, lo, hi)
        return hi if highest else lo

    def take(self, column: npt.NDArray[Any], candidates: IntArray) -> npt.NDArray[Any]:
        """`column[candidates]`, without the gather when `candidates` is the whole table. Read-only result."""
        if self._whole and candidates is self.candidates:
            return column
        return column[candidates]


class Plugin(Protocol):
    """Every plugin has the type name it was registered under and the name the config gave it."""

    type_name: str
    name: str


class Filter(Plugin, Protocol):
    """Narrows the candidate slots. Returning an empty array means no candidate fits the request."""

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray: ...


class Scorer(Plugin, Protocol):
    """Scores candidate slots; one float per candidate, in [0, 1], higher is better; a new array (the runner may
    write into it).

    Each scorer applies its own NaN policy (unknown → neutral, documented per scorer). Scorers whose class sets
    `UNIT_INTERVAL = True` guarantee [0, 1] by construction (the property tests check it); the runner clamps any
    other scorer's output, and maps a NaN total to 0, so a scorer bug can bias a pick but never poison it."""

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray: ...


# A scorer's score as scale × values + offset (values read-only, None when scale is 0); see `Affine`.
AffineScore = tuple[FloatArray | None, float, float]


class Affine(Protocol):
    """Optional for a scorer whose score this pick is an affine function of one array (a min-max normalised
    column, 1 − a column, a match count over the prompt length): `affine` returns it as (values, scale, offset),
    or None when the pick needs the general `score` (NaN present, a degenerate range).

    The runner then adds weight × scale × values to the total with one multiply-add, instead of the scorer
    building its own array and the runner weighting and adding it: at pool sizes of a few dozen, numpy calls
    cost more than their arithmetic. The affine form must equal `score` up to rounding (tests check both).
    """

    def affine(self, state: CycleState, candidates: IntArray) -> AffineScore | None: ...


class Picker(Plugin, Protocol):
    """Chooses slots from scored candidates, best first; extra slots are the gateway's fallbacks."""

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]: ...


class PickObserver(Plugin, Protocol):
    """Learns from the final pick (upstream's PreRequest): the prefix index records the prompt's blocks there."""

    def picked(self, state: CycleState, slot: int) -> None: ...


def sanitize(scores: FloatArray) -> FloatArray:
    """Clamp to [0, 1] in place; NaN → 0 (`fmax` prefers the number). Two ufunc calls, no Python-level checks."""
    np.fmax(scores, 0.0, out=scores)
    np.fmin(scores, 1.0, out=scores)
    return scores
