"""A uniform random pick: the stand-in before a profile is configured, and the FailOpen degraded path."""

from __future__ import annotations

import random
from collections.abc import Sequence

from epp.datastore import Snapshot
from epp.datastore.table import IntArray
from epp.requests import InferenceRequest


class RandomScheduler:
    """Picks uniformly among the candidates; seeded so tests and benchmarks are reproducible."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: InferenceRequest, now: float) -> Sequence[int]:
        if candidates.size == 0:
            return ()
        return (int(candidates[self._rng.randrange(candidates.size)]),)
