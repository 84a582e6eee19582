"""The shared block table across processes: the feeder's process writes it, the serving process reads it in place.

Memory is memfd, as every block the picker shares (epp.supervision.memory): nothing has a name in /dev/shm, so
nothing is left behind by a process that dies however it dies, and no resource tracker is involved.
- The directory: one uint64, the current table generation, written after that table is complete. Its reader
  creates it (`new_directory`) and hands it to the writer (in `epp serve`, at the feeder child's spawn).
- A table per generation: the writer (`SegmentAllocator`, the `alloc` of a `TableWriter`) creates a memory file
  for it and announces it (`announce(generation, fd)`: in `epp serve` a message on the child's pipe with the
  descriptor attached), then points the directory at it once complete; the table it replaced is marked retired by
  the `TableWriter`. The writer lets go of a generation two rebuilds later; a reader still mapped keeps valid
  memory (the mapping holds it) until it moves on.

The reader (`TableReader`) maps each announced table (`add`) and follows the directory, checking the retired flag
once per lookup: it moves to the generation the directory names as soon as that table has been announced to it;
until then the retired table still reads as it was when the writer left it (a pick sees the blocks a rebuild
late, as it would a scrape row).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable

import numpy as np

from epp.kvevents.blockkeys import U64Array
from epp.kvevents.shared import Counts, SharedBlockTable
from epp.supervision.memory import new_memfd


def new_directory() -> int:
    """The directory's memory file (generation 0 until the writer says otherwise)."""
    return new_memfd("kv-directory", 8)


class SegmentAllocator:
    """Creates and lets go of the writer's tables: a `TableWriter`'s `alloc` and `published`. `close()` lets go
    of all. `announce(generation, fd)` is told of every new table before it is filled; `fd` stays the allocator's
    (a receiver that keeps it duplicates it; mapping it is enough)."""

    def __init__(self, directory_fd: int, announce: Callable[[int, int], None]) -> None:
        self._directory = mmap.mmap(directory_fd, 8)
        self._current = np.frombuffer(self._directory, dtype="<u8")
        self._current[0] = 0
        self._announce = announce
        self._segments: dict[int, mmap.mmap] = {}

    def __call__(self, generation: int, nbytes: int) -> memoryview:
        fd = new_memfd(f"kv-table-{generation}", nbytes)
        try:
            seg = mmap.mmap(fd, nbytes)
            self._announce(generation, fd)
        finally:
            os.close(fd)
        self._segments[generation] = seg
        for old in [g for g in self._segments if g < generation - 1]:
            self._release(old)
        return memoryview(seg)

    def published(self, generation: int) -> None:
        """Point readers at a generation (after its table is complete)."""
        self._current[0] = generation

    def _release(self, generation: int) -> None:
        seg = self._segments.pop(generation)
        with contextlib.suppress(BufferError):  # the writer's table may still view it; the mapping goes with it
            seg.close()

    def close(self) -> None:
        for g in list(self._segments):
            self._release(g)
        del self._current
        with contextlib.suppress(BufferError):
            self._directory.close()


class TableReader:
    """The serving side: maps the announced tables, follows the directory; never copies a table."""

    def __init__(self, directory_fd: int) -> None:
        self._directory = mmap.mmap(directory_fd, 8)
        self._current = np.frombuffer(self._directory, dtype="<u8")
        self._mapped: dict[int, mmap.mmap] = {}  # announced tables not yet attached
        self._generation = -1
        self._segment: mmap.mmap | None = None
        self._table: SharedBlockTable | None = None
        self._stale: list[mmap.mmap] = []  # old tables a caller's view still held: closed when it lets go

    def add(self, generation: int, fd: int) -> None:
        """A table the writer announced (the descriptor stays the caller's: it is mapped, not kept)."""
        self._mapped[generation] = mmap.mmap(fd, os.fstat(fd).st_size)

    def table(self) -> SharedBlockTable | None:
        """The current table; None before the first is announced and published."""
        if self._table is None or self._table.retired:
            generation = int(self._current[0])
            if generation != self._generation and generation in self._mapped:
                self._attach(generation)
        return self._table

    def _attach(self, generation: int) -> None:
        self._table = None  # drop the old table's views first, or its mapping cannot be closed
        seg = self._mapped.pop(generation)
        old, self._segment, self._generation = self._segment, seg, generation
        self._table = SharedBlockTable(memoryview(seg))
        if old is not None:
            self._stale.append(old)
        for g in [g for g in self._mapped if g < generation]:  # announced, never published, now superseded
            self._stale.append(self._mapped.pop(g))
        self._close_stale()

    def _close_stale(self) -> None:
        keep = []
        for seg in self._stale:
            try:
                seg.close()
            except BufferError:
                keep.append(seg)
        self._stale = keep

    def prefix_blocks(self, keys: U64Array) -> Counts | None:
        """Each endpoint slot's leading blocks of `keys`; None while there is no table to read."""
        table = self.table()
        return table.prefix_blocks(keys) if table is not None else None

    def close(self) -> None:
        self._table = None
        del self._current
        self._stale.extend(self._mapped.values())
        self._mapped = {}
        if self._segment is not None:
            self._stale.append(self._segment)
            self._segment = None
        self._close_stale()
        with contextlib.suppress(BufferError):
            self._directory.close()
