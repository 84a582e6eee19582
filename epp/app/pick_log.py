"""The serving workers' shared log of picks: every worker's prefix index learns every worker's picks.

A prefix scorer remembers what it sent where. With `--workers N` each worker has its own scorer, and one that learns
only its own picks sends a repeat of another worker's prompt elsewhere: measured in virtual time
(benchmarks/RESULTS.md, `--pick-log`), shared-prefix p90 TTFT 27 → 101 ms at 2 workers and → 453 ms at 4, and
the same 27 ms at 2 and 4 workers when every index also learns the other workers' picks within 50 ms.

So each worker appends a record (scorer, endpoint, block hashes) per pick to its own ring in shared memory, and
at each refresh (epp.app.worker: as a decision reads the table, at most every `REFRESH_S`) each worker applies the
records the others appended since (`PrefixCacheScorer.learn`, and `ApproxPrefixCacheProducer.learn`; a repeat the
index already holds young skips its match, `PrefixIndex.holds_young`). One writer per ring, no lock: a record is
stamped with its sequence number after its payload is written (negative while it is written), so a reader copies it
and keeps it only if the stamp it read before and after is the one it expects; a reader lapped by a writer skips
what was overwritten and counts it. The rings live in one memfd that the control process owns, so a restarted
worker continues its ring where its predecessor stopped, and starts by learning the others' last `CAPACITY` picks.

Records name the endpoint by the control process's slot and its token (epp.app.workers), so a pick on an endpoint
that has since left, or whose slot was reused, is dropped, not learned for its successor.
"""

from __future__ import annotations

import functools
import importlib
from array import array
from collections.abc import Callable, Iterable
from typing import Protocol, cast

import numpy as np

CAPACITY = 1024  # records per worker's ring: seconds of picks at thousands per second per worker, read every 10 ms
MAX_HASHES = 256  # block hashes kept per record (the prefix scorer's default depth); deeper ones are not shared
_HEADER = 4  # stamp, control slot, token, scorer position << 16 | hash count
RECORD_WORDS = _HEADER + MAX_HASHES
_STAMP, _SLOT, _TOKEN, _SHAPE = range(_HEADER)


class Kernels(Protocol):
    """The extension's functions (epp/app/_pick_log.pyi): `PickLog.append_python` and `PickLog.read_python`, a
    call each, a small pool's in-flight sums (epp.app.mirror_table's `MirrorTable._sum_cells`) and a pick's booking in
    our row of the in-flight matrix (`MirrorTable.book_cells_python`, `release_cells_python`)."""

    ENABLED: int

    def append_record(
        self, ring: tuple[object, int, int, int, int], position: int, slot: int, token: int, hashes: list[int]
    ) -> None: ...

    def read_rings(
        self, block: object, workers: int, capacity: int, record_words: int, me: int, next: list[int]
    ) -> tuple[list[tuple[int, int, int, list[int]]], int]: ...

    def sum_cells(
        self,
        cells: object,
        end: int,
        stride: int,
        pairs: list[tuple[int, int]],
        inflight: object,
        picks: object,
        tokens: object,
    ) -> None: ...

    def book_cells(self, cells: object, base: int, control_of: list[int], slot: int, tokens: int) -> None: ...

    def release_cells(self, cells: object, base: int, control_of: list[int], slot: int, tokens: int) -> None: ...


_compiled: Kernels | None
try:  # built without a compiler: the Python code runs
    _compiled = cast(Kernels, importlib.import_module("epp.app._pick_log"))
except ImportError:
    _compiled = None

NATIVE: Kernels | None = _compiled if _compiled is not None and _compiled.ENABLED else None


def ring_words(workers: int) -> int:
    """int64 words of the shared block for `workers` rings: a head per worker, then the rings."""
    return workers + workers * CAPACITY * RECORD_WORDS


class PickLog:
    """One worker's end of the shared log: it writes its own ring and reads everyone else's. `me` −1: a reader of
    every ring that writes none (the control process, which learns the precise producer's owed stores)."""

    append: Callable[[int, int, int, list[int]], None]
    """`append(position, slot, token, hashes)`: one pick of ours, `hashes` now on the control process's `slot` (with
    its `token`), by scorer `position`. `append_python`, compiled when it can be: the extension's call with the
    block and its layout bound (`functools.partial` of one tuple), so a pick costs one C call, not a Python frame,
    an array and a dozen memoryview operations."""

    def __init__(self, block: np.ndarray, workers: int, me: int, native: Kernels | None = NATIVE) -> None:
        self._native = native  # None: the Python definitions run (tests hold the two equal)
        self._rings = block[workers:].reshape(workers, CAPACITY, RECORD_WORDS)
        # The same words as Python ints (flat memoryviews of the one contiguous block, signed and unsigned): a
        # record's header and hashes cost a few index operations, not a numpy scalar each (~3.3 → ~1 µs a record).
        self._words = block.data.cast("B").cast("q")
        self._unsigned = self._words.cast("B").cast("Q")
        self._workers = workers
        self._me = me
        # A worker that starts (or restarts) learns the others' last CAPACITY picks first: a warm index.
        self._next = [max(0, self._words[w] - CAPACITY) for w in range(workers)]
        self.lost = 0  # records overwritten before this worker read them
        if native is None:
            self.append = self.append_python
        else:
            ring = (self._words, workers, CAPACITY, RECORD_WORDS, me)  # one argument: the partial's stack holds 5
            self.append = functools.partial(native.append_record, ring)

    def _record(self, worker: int, seq: int) -> int:
        """The word offset of `worker`'s record `seq` in the block."""
        return self._workers + (worker * CAPACITY + seq % CAPACITY) * RECORD_WORDS

    def append_python(self, position: int, slot: int, token: int, hashes: list[int]) -> None:
        """The definition of `append`."""
        words, me = self._words, self._me
        seq = words[me]
        at = self._record(me, seq)
        count = len(hashes)
        if count > MAX_HASHES:
            count, hashes = MAX_HASHES, hashes[:MAX_HASHES]
        words[at + _STAMP] = -(seq + 1)  # being written
        words[at + _SLOT] = slot
        words[at + _TOKEN] = token
        words[at + _SHAPE] = position << 16 | count
        self._unsigned[at + _HEADER : at + _HEADER + count] = array("Q", hashes)
        words[at + _STAMP] = seq + 1  # whole
        words[me] = seq + 1

    def heads(self) -> list[int]:
        """Every ring's head (records appended so far), as Python ints."""
        return self._words[: self._workers].tolist()

    def _unread_from(self, start: int, head: int) -> int:
        """The first record of a ring still to read, past `start` (where this reader stopped) up to `head`: from 0
        when its writer restarted from an older head (the ring reset under us), and never more than the ring holds
        (what a writer lapped is counted in `lost`)."""
        if head < start:
            start = 0
        if head - start > CAPACITY:
            self.lost += head - start - CAPACITY
            start = head - CAPACITY
        return start

    def read(self) -> list[tuple[int, int, int, list[int]]]:
        """(scorer position, control slot, token, hashes) of every whole record the other workers appended since the
        last call (none: an empty list, so a refresh with nothing new to learn stops there). A writer that restarted
        from an older head (its ring reset) is read from there. `read_python`, compiled when it can be (one call for
        every ring, not a generator step, two slices and a copy per record; consecutive records with equal hashes
        share one list, which every learner only reads)."""
        native = self._native
        if native is None:
            return list(self.read_python())
        records, lost = native.read_rings(self._words, self._workers, CAPACITY, RECORD_WORDS, self._me, self._next)
        if lost:
            self.lost += lost
        return records

    def read_python(self) -> Iterable[tuple[int, int, int, list[int]]]:
        """The definition of `read` (a generator: each ring's position moves as it is read to its end)."""
        words, unsigned = self._words, self._unsigned
        for worker, start in enumerate(self._next):
            if worker == self._me:
                continue
            head = words[worker]
            start = self._unread_from(start, head)
            for seq in range(start, head):
                at = self._record(worker, seq)
                stamp, slot, token, shape = words[at : at + _HEADER]  # a copy, before the hashes (the seqlock's order)
                count = shape & 0xFFFF
                values = unsigned[at + _HEADER : at + _HEADER + min(count, MAX_HASHES)].tolist()
                if stamp != seq + 1 or words[at + _STAMP] != seq + 1:  # overwritten while we read
                    self.lost += 1
                    continue
                yield shape >> 16, slot, token, values
            self._next[worker] = head
