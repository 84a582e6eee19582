"""The shared block table across processes: the feeder's process writes segments, the serving process reads them.

Segments (POSIX shared memory, `multiprocessing.shared_memory`):
- `<prefix>`: a directory of one uint64, the current table generation (written after the table is complete);
- `<prefix>-<generation>`: the `SharedBlockTable` of that generation.

The writer (`SegmentAllocator`, the `alloc` of a `TableWriter`) creates a generation's segment, then points the
directory at it; the table it replaced is marked retired by the `TableWriter`. It unlinks a generation's name two
rebuilds later: a reader still mapped to it keeps reading valid memory (unlinking removes the name, not the
mapping) and moves on when it sees the retired flag. The reader (`TableReader`) checks that flag once per lookup and
follows the directory. Segment lifetimes are explicit: both sides opt out of Python's resource tracker, which would
otherwise unlink a segment when the first process that touched it exits.
"""

from __future__ import annotations

import contextlib
import secrets
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from epp.kvevents.blockkeys import U64Array
from epp.kvevents.shared import Counts, SharedBlockTable


def new_prefix() -> str:
    return f"epp-kv-{secrets.token_hex(4)}"


def _untrack(shm: SharedMemory) -> None:
    """Keep Python < 3.13's resource tracker from unlinking the segment when this process exits."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.unregister(getattr(shm, "_name"), "shared_memory")  # noqa: B009


def _unlink(shm: SharedMemory) -> None:
    """`shm.unlink()`, which also unregisters the name from the resource tracker: give the tracker the name back
    first, or its process prints a KeyError traceback for every segment at our exit."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.register(getattr(shm, "_name"), "shared_memory")  # noqa: B009
    with contextlib.suppress(FileNotFoundError):
        shm.unlink()


class SegmentAllocator:
    """Creates and retires the writer's segments: a `TableWriter`'s `alloc` and `published`. `close()` unlinks all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._directory = SharedMemory(name=prefix, create=True, size=8)
        _untrack(self._directory)
        assert self._directory.buf is not None
        self._current = np.frombuffer(self._directory.buf, dtype="<u8")
        self._current[0] = 0
        self._segments: dict[int, SharedMemory] = {}

    def __call__(self, generation: int, nbytes: int) -> memoryview:
        seg = SharedMemory(name=f"{self.prefix}-{generation}", create=True, size=nbytes)
        _untrack(seg)
        self._segments[generation] = seg
        for old in [g for g in self._segments if g < generation - 1]:
            self._release(old)
        assert seg.buf is not None
        return seg.buf

    def published(self, generation: int) -> None:
        """Point readers at a generation (after its table is complete)."""
        self._current[0] = generation

    def _release(self, generation: int) -> None:
        seg = self._segments.pop(generation)
        _unlink(seg)
        with contextlib.suppress(BufferError):  # the writer's table may still view it; the mapping goes with it
            seg.close()

    def close(self) -> None:
        for g in list(self._segments):
            self._release(g)
        del self._current
        _unlink(self._directory)
        with contextlib.suppress(BufferError):
            self._directory.close()


class TableReader:
    """The serving side: attaches to the current table and follows rebuilds; never copies the table."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._directory = SharedMemory(name=prefix)
        _untrack(self._directory)
        assert self._directory.buf is not None
        self._current = np.frombuffer(self._directory.buf, dtype="<u8")
        self._segment: SharedMemory | None = None
        self._table: SharedBlockTable | None = None
        self._stale: list[SharedMemory] = []  # old segments a caller's table still viewed: closed when it lets go

    def table(self) -> SharedBlockTable:
        if self._table is None or self._table.retired:
            self._attach(int(self._current[0]))
        assert self._table is not None
        return self._table

    def _attach(self, generation: int) -> None:
        self._table = None  # drop the old table's views first, or its segment cannot be closed
        seg = SharedMemory(name=f"{self.prefix}-{generation}")
        _untrack(seg)
        assert seg.buf is not None
        old, self._segment = self._segment, seg
        self._table = SharedBlockTable(seg.buf)
        if old is not None:
            self._stale.append(old)
        self._close_stale()

    def _close_stale(self) -> None:
        keep = []
        for seg in self._stale:
            try:
                seg.close()
            except BufferError:
                keep.append(seg)
        self._stale = keep

    def prefix_blocks(self, keys: U64Array) -> Counts:
        return self.table().prefix_blocks(keys)

    def close(self) -> None:
        self._table = None
        del self._current
        self._close_stale()
        for seg in (self._segment, self._directory):
            if seg is not None:
                seg.close()
