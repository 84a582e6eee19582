"""The block index as a flat table another process reads without copying: one writer, lock-free readers.

Layout of one buffer (a `multiprocessing.shared_memory` segment in production, any writable buffer in tests), all
little-endian uint64:

    header[8]           magic, capacity C (a power of two), mask words W, generation, used slots, retired, 2 spare
    keys[C]             a block key per slot; 0 = empty (keys 0 and 1 are stored as 2 and 3: a 2^-63 collision)
    masks[C × W]        the endpoints holding that block, one bit per endpoint slot

Open addressing, linear probing from `fmix(key) & (C − 1)`, at most `MAX_PROBE` slots. Nothing is ever deleted: a
block no endpoint holds keeps its slot with mask 0, which reads as a miss. So a slot's key, once written, never
changes, and the writer writes a new slot's mask before its key: a reader that sees the key sees a mask that was
true at some moment. A mask word is one aligned 8-byte store, so each endpoint's bit is either the old or the new
value, never torn; a pick that races a write sees the block one event early or late, as it would a scrape row. When
the table runs out of room (half full, or a probe longer than `MAX_PROBE`), `set` returns False and the owner
(`TableWriter`) rebuilds a larger table from its index into a new buffer, generation + 1, and marks the old one
retired, which readers check once per pick to move on to the next generation's segment.

Reading is vectorised: all of a request's keys are probed at once (`MAX_PROBE` numpy rounds at most, usually one
or two), the masks are ANDed cumulatively down the prompt, and each endpoint's longest prefix is the number of rows
its bit survives: a handful of vector operations plus a step per endpoint whose prefix ends.
`KvBlockIndex.match` walks Python dicts instead; both answer the same question with the same keys, and
benchmarks/kv_events.py measures both side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from epp.kvevents.blockkeys import U64Array
from epp.kvevents.index import KvBlockIndex

MAGIC: Final = 0x4B56_424C_4B53_0001  # "KVBLKS" v1
HEADER_WORDS: Final = 8
MAX_PROBE: Final = 16
_CAP, _WORDS, _GEN, _USED, _RETIRED = 1, 2, 3, 4, 5
_C1, _C2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def _fmix(x: U64Array) -> U64Array:
    x = x ^ (x >> _S33)
    x = x * _C1
    x ^= x >> _S33
    x *= _C2
    x ^= x >> _S33
    return x


def _fmix1(x: int) -> int:
    m = (1 << 64) - 1
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    return x ^ (x >> 33)


def table_bytes(capacity: int, words: int) -> int:
    return 8 * (HEADER_WORDS + capacity + capacity * words)


class SharedBlockTable:
    """A view over one buffer; `create=True` lays out an empty table, otherwise the buffer's header is read."""

    def __init__(
        self, buf: memoryview | bytearray, capacity: int = 0, words: int = 1, create: bool = False, generation: int = 0
    ) -> None:
        whole = np.frombuffer(buf, dtype="<u8")
        if create:
            if capacity < 8 or capacity & (capacity - 1):
                raise ValueError("capacity must be a power of two, at least 8")
            if words < 1:
                raise ValueError("words must be positive")
            if len(whole) < HEADER_WORDS + capacity * (1 + words):
                raise ValueError("buffer too small for the table")
            whole[: HEADER_WORDS + capacity * (1 + words)] = 0
            whole[_CAP], whole[_WORDS], whole[_GEN] = capacity, words, generation
            whole[0] = MAGIC
        elif whole[0] != MAGIC:
            raise ValueError("not a block table (bad magic)")
        self.capacity = int(whole[_CAP])
        self.words = int(whole[_WORDS])
        c, w = self.capacity, self.words
        self._header = whole[:HEADER_WORDS]
        self._keys = whole[HEADER_WORDS : HEADER_WORDS + c]
        self._masks = whole[HEADER_WORDS + c : HEADER_WORDS + c + c * w].reshape(c, w)
        self._mask_c = np.uint64(c - 1)
        self._used = int(whole[_USED])

    @property
    def generation(self) -> int:
        return int(self._header[_GEN])

    @property
    def retired(self) -> bool:
        return bool(self._header[_RETIRED])

    def retire(self) -> None:
        """Tell readers this table is superseded (they re-attach to the next generation's segment)."""
        self._header[_RETIRED] = 1

    # -- the writer ---------------------------------------------------------------------------------------------

    def set(self, key: int, mask: int) -> bool:
        """Record who holds `key` now (`mask` over all W words); False when there is no room: rebuild larger."""
        k = key if key > 1 else key + 2
        c1 = self.capacity - 1
        slot = _fmix1(k) & c1
        keys = self._keys
        for _ in range(MAX_PROBE):
            have = int(keys[slot])
            if have == k:
                self._write_mask(slot, mask)
                return True
            if have == 0:
                if mask == 0:
                    return True  # nobody holds a block we never stored: nothing to write
                if 2 * (self._used + 1) > self.capacity:
                    return False
                self._write_mask(slot, mask)
                keys[slot] = k  # after the mask: a reader that sees the key sees its mask
                self._used += 1
                self._header[_USED] = self._used
                return True
            slot = (slot + 1) & c1
        return False

    def _write_mask(self, slot: int, mask: int) -> None:
        row = self._masks[slot]
        for w in range(self.words):
            row[w] = (mask >> (64 * w)) & 0xFFFF_FFFF_FFFF_FFFF

    # -- readers ------------------------------------------------------------------------------------------------

    def prefix_blocks(self, keys: U64Array) -> npt.NDArray[np.int64]:
        """Per endpoint slot (W × 64 of them), how many of `keys`' leading blocks it holds."""
        n = len(keys)
        out_bits = 64 * self.words
        if n == 0:
            return np.zeros(out_bits, dtype=np.int64)
        k = keys.astype(np.uint64, copy=True)
        if k.min() < 2:  # keys 0 and 1 are stored as 2 and 3 (0 marks an empty slot); ~2^-63 of keys
            k[k < 2] += np.uint64(2)
        slot = _fmix(k) & self._mask_c
        # the first probe for every key at once; only keys whose slot holds another key probe on
        seen = self._keys[slot]
        absent = np.flatnonzero(seen == 0)
        if absent.size:  # keys are never deleted, so an empty first slot means no endpoint holds the key: every
            n = int(absent[0])  # prefix ends before it, and the rows after it need no probing
            if n == 0:
                return np.zeros(out_bits, dtype=np.int64)
            k, slot, seen = k[:n], slot[:n], seen[:n]
        miss = seen != k  # every slot left is occupied: a miss is another key there, probe on
        masks = self._masks[slot]
        masks[miss] = 0
        todo = np.flatnonzero(miss)
        for _ in range(MAX_PROBE - 1):
            if not len(todo):
                break
            slot[todo] = (slot[todo] + np.uint64(1)) & self._mask_c
            seen = self._keys[slot[todo]]
            found = seen == k[todo]
            if found.any():
                masks[todo[found]] = self._masks[slot[todo[found]]]
            todo = todo[~found & (seen != 0)]
        held = np.bitwise_and.accumulate(masks, axis=0)
        # each bit stays set for a leading run of rows: its count is the row where it drops (n if never). The
        # column changes value at most once per endpoint, so walking its change points is cheap.
        counts = np.zeros(out_bits, dtype=np.int64)
        for w in range(self.words):
            column = held[:, w]
            alive = int(column[0])
            for row in (np.flatnonzero(column[1:] != column[:-1]) + 1).tolist():
                now = int(column[row])
                _credit(counts, alive & ~now, 64 * w, row)
                alive = now
            _credit(counts, alive, 64 * w, n)
        return counts


def _credit(counts: npt.NDArray[np.int64], bits: int, base: int, rows: int) -> None:
    while bits:
        low = bits & -bits
        bits ^= low
        counts[base + low.bit_length() - 1] = rows


class TableWriter:
    """Keeps a `SharedBlockTable` equal to an index's holders: install as the index's `mirror`.

    `alloc(generation, nbytes)` returns the buffer for a table (a new shared-memory segment named after the
    generation, in production: `epp.kvevents.publish.SegmentAllocator`); `published(generation)` is told when that
    table is complete. When a table is full, or the endpoint slots outgrow its mask words, a larger one is built
    from the index, and the old one retired.
    """

    def __init__(
        self,
        index: KvBlockIndex,
        alloc: Callable[[int, int], memoryview | bytearray],
        capacity: int = 1 << 16,
        published: Callable[[int], None] | None = None,
    ) -> None:
        self.index = index
        self._alloc = alloc
        self._published = published
        self.table = self._build(capacity, self._words_needed(), 0)
        index.mirror = self

    def _words_needed(self) -> int:
        return max(1, -(-self.index.slots() // 64))

    def _build(self, capacity: int, words: int, generation: int) -> SharedBlockTable:
        while True:
            table = SharedBlockTable(
                self._alloc(generation, table_bytes(capacity, words)), capacity, words, True, generation
            )
            if all(table.set(k, m) for k, m in self.index.holders.items()):
                if self._published is not None:
                    self._published(generation)  # complete: readers may be pointed at it
                return table
            capacity *= 2

    def __call__(self, key: int, mask: int) -> None:
        table = self.table
        if mask >> (64 * table.words) == 0 and table.set(key, mask):
            return
        live = len(self.index.holders)
        capacity = max(table.capacity * 2, 1 << max(3, (4 * live).bit_length()))
        self.table = self._build(capacity, max(table.words, self._words_needed()), table.generation + 1)
        table.retire()
