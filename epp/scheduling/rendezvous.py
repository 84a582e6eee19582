"""`rendezvous-picker`: picks that agree across picker replicas that never talk to each other.

Active-active replicas each score with their own in-flight view and their own prefix index, so their scores for one
request differ a little; a max-score picker with a random tie-break then sends requests that share a prefix to
different endpoints depending on which replica took them. This picker keeps the endpoints within a load band
(consistent hashing with bounded loads): an endpoint's queue as this replica sees it, last scraped `waiting` plus
its own picks since that scrape that are still in flight, at most `(1 + loadFactor)` × the candidates' mean, plus
one; optionally also a score `band` of the best, as a fraction of the score range (off by default). Among those it
chooses by rendezvous (highest-random-weight) hashing of the request's leading `keyBytes` of prompt (and its model)
with each endpoint's address: every replica that sees the same band picks the same endpoint for the same leading
prefix, and an endpoint leaving or joining moves only the keys it wins. Distinct prefixes hash uniformly over the
band, so a burst split over replicas spreads instead of herding; an endpoint that fills up leaves the band in every
replica's view as its metrics (and that replica's own picks) show it. Measured in
tests/scheduling/test_rendezvous.py: two replicas, 40 shared prefixes, 400 requests: 343 of 360 repeats (95 %) land
with the first; a 100-request burst split over 1, 2 or 4 replicas puts at most 18 on any of 8 endpoints.

Pure: hashes are blake2b (never Python's `hash()`, which differs per process), no clock, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from epp.datastore.table import FloatArray, IntArray
from epp.scheduling.framework import CycleState, extremes
from epp.scheduling.pickers import SeededPicker

DEFAULT_BAND = 1.0  # every candidate's score is acceptable: the load band alone bounds the load
DEFAULT_LOAD_FACTOR = 0.5
DEFAULT_KEY_BYTES = 256
_MASK = (1 << 64) - 1


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mix(key: int, member: int) -> int:
    """A 64-bit finaliser (splitmix64) of the pair: the rendezvous weight of one endpoint for one key."""
    z = (key ^ member) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class RendezvousPicker(SeededPicker):
    """Within a score band of the best, the endpoint that wins the rendezvous hash of the leading prefix."""

    type_name = "rendezvous-picker"

    def __init__(
        self,
        name: str | None = None,
        max_endpoints: int = 1,
        seed: int | None = None,
        band: float = DEFAULT_BAND,
        key_bytes: int = DEFAULT_KEY_BYTES,
        load_factor: float = DEFAULT_LOAD_FACTOR,
    ) -> None:
        super().__init__(name, max_endpoints, seed)
        self.band = min(1.0, max(0.0, band))
        self.load_factor = max(0.0, load_factor)
        self.key_bytes = max(1, key_bytes)
        self._members: dict[str, int] = {}

    def key_of(self, prompt: str, model: str) -> int:
        """The rendezvous key: the model and the prompt's leading `key_bytes` (all of it when shorter)."""
        head = prompt.encode("utf-8", "surrogatepass")[: self.key_bytes]
        return _digest(model.encode("utf-8", "surrogatepass") + b"\0" + head)

    def _member(self, address: str) -> int:
        value = self._members.get(address)
        if value is None:
            if len(self._members) > 65536:  # addresses come and go with pods: bound the cache
                self._members.clear()
            value = self._members[address] = _digest(address.encode())
        return value

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]:
        n = candidates.size
        if n == 0:
            return ()
        lo, hi, _ = extremes(scores)
        snap = state.snapshot
        # Our picks since the scrape count only while still in flight: one that already finished is load no longer.
        unseen = np.minimum(snap.picks_since_scrape[candidates], snap.inflight[candidates])
        load = np.nan_to_num(snap.waiting[candidates], nan=0.0) + unseen
        bounded = load <= (1.0 + self.load_factor) * float(load.mean()) + 1.0  # never empty: the least loaded is in
        in_band = np.flatnonzero(bounded & (scores >= hi - self.band * max(hi - lo, 1e-9)))
        if in_band.size == 0:
            in_band = np.flatnonzero(bounded)
        request = state.request
        key = self.key_of(request.prompt or "", request.model or "")
        addresses = snap.addresses
        weights = [_mix(key, self._member(addresses[int(candidates[i])])) for i in in_band.tolist()]
        order = [
            int(candidates[in_band[i]]) for i in sorted(range(len(weights)), key=weights.__getitem__, reverse=True)
        ]
        if self.max_endpoints == 1 or len(order) >= self.max_endpoints:
            return order[: self.max_endpoints]
        # Fallbacks beyond the band: the rest by score, best first.
        rest = [
            int(candidates[i]) for i in np.argsort(-scores, kind="stable").tolist() if int(candidates[i]) not in order
        ]
        return (order + rest)[: self.max_endpoints]
