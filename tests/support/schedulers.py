"""A uniform random pick over the candidates: the scheduler of tests and benchmarks that are about everything but
scheduling (seeded, so they are reproducible)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from epp.datastore import Snapshot
from epp.datastore.table import IntArray
from epp.requests import InferenceRequest


class RandomScheduler:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: InferenceRequest, now: float) -> Sequence[int]:
        if candidates.size == 0:
            return ()
        return (int(candidates[self._rng.randrange(candidates.size)]),)
