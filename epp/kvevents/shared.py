"""The block index as a flat table another process reads without copying: one writer, lock-free readers.

Layout of one buffer (a `multiprocessing.shared_memory` segment in production, any writable buffer in tests), all
little-endian uint64:

    header[8]           magic, capacity C (a power of two), mask words W, generation, used slots, retired, 2 spare
    keys[C]             a block key per slot; 0 = empty
    masks[C × W]        the endpoints holding that block, one bit per endpoint slot

Block keys are odd by construction (`epp.kvevents.blockkeys`: their 2^-63 collision per pair of blocks is the
price), so 0 is never a key and marks an empty slot with no fix-up on either side; `set` refuses an even key.
The home slot of a key is its top log2(C) bits
(`key >> (64 − log2 C)`): the keys are already mixed, so their high bits are as uniform as any hash of them, and
the slot costs one shift (`_home`: the one definition, used by the writer's `set` and by the reader). Open
addressing, linear probing from the home slot, at most `MAX_PROBE` slots. Nothing is ever deleted: a block no
endpoint holds keeps its slot with mask 0, which reads as a miss. So a slot's key, once written, never changes, and
the writer writes a new slot's mask before its key: a reader that sees the key sees a mask that was true at some
moment. A mask word is one aligned 8-byte store, so each endpoint's bit is either the old or the new value, never
torn; a pick that races a write sees the block one event early or late, as it would a scrape row. When the table
runs out of room (half full, or a probe longer than `MAX_PROBE`), `set` returns False and the owner
(`TableWriter`) rebuilds a larger table from its index into a new buffer, generation + 1, and marks the old one
retired, which readers check once per pick to move on to the next generation's segment.

Reading is vectorised, in a dozen numpy calls whatever the endpoint count: every key's home slot at once; in the
common case each key is either in its home slot or the prefix ends at the first key whose home slot is empty (no
endpoint holds it, and keys are never deleted), which one `argmin` finds; only a key whose home slot holds another
key sends the lookup to the probing loop. The masks are ANDed cumulatively down the prompt, and since a bit that
drops never comes back, each endpoint's prefix is the number of rows its bit is set in: the rows unpacked to one
byte per bit and summed (`_row_counts`).
`KvBlockIndex.match` walks Python dicts instead; both answer the same question with the same keys, tests hold them
equal, and benchmarks/kv_events.py measures both side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from epp.kvevents.blockkeys import U64Array
from epp.kvevents.index import KvBlockIndex

MAGIC: Final = 0x4B56_424C_4B53_0002  # "KVBLKS" v2: odd keys stored as they are, home slot from the top bits
HEADER_WORDS: Final = 8
MAX_PROBE: Final = 16
_CAP, _WORDS, _GEN, _USED, _RETIRED = 1, 2, 3, 4, 5
# rows summed at once in `_row_counts`: one byte per endpoint bit holds a count up to 255
_LANE_ROWS: Final = 255
_ONES = np.ones(_LANE_ROWS, dtype=np.uint64)
Counts = npt.NDArray[np.unsignedinteger[Any]]


def _home(key: int, shift: int) -> int:
    """A key's home slot: its top log2(capacity) bits (the reader shifts a whole array the same way)."""
    return key >> shift


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
        self._mask_c = np.int64(c - 1)
        self._shift = 64 - (c.bit_length() - 1)
        self._shift_u = np.uint64(self._shift)
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
        if not key & 1:
            raise ValueError(f"block keys are odd, got {key:#x}")
        k = key
        c1 = self.capacity - 1
        slot = _home(k, self._shift)
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

    def prefix_blocks(self, keys: U64Array) -> Counts:
        """Per endpoint slot (W × 64 of them), how many of `keys`' leading blocks (odd, as every block key) it
        holds."""
        if len(keys) == 0:
            return np.zeros(64 * self.words, dtype=np.uint64)
        k = keys
        slot = (k >> self._shift_u).view(np.int64)
        seen = self._keys[slot]
        hit = seen == k
        first = int(hit.argmin())  # the first key not in its home slot (0 when every key is)
        if hit[first]:
            masks = self._masks[slot]
        elif seen[first] == 0:  # an empty home slot: no endpoint holds that key, every prefix ends before it
            if first == 0:
                return np.zeros(64 * self.words, dtype=np.uint64)
            masks = self._masks[slot[:first]]
        else:  # another key in its home slot: probe on
            masks = self._probed(k, slot, seen)
            if not len(masks):
                return np.zeros(64 * self.words, dtype=np.uint64)
        return _row_counts(np.bitwise_and.accumulate(masks, axis=0))

    def _probed(self, k: U64Array, slot: npt.NDArray[np.int64], seen: U64Array) -> U64Array:
        """The masks of the leading keys, probing past home slots that hold other keys; the rows stop before the
        first key whose probe ends in an empty slot (no endpoint holds it)."""
        absent = np.flatnonzero(seen == 0)
        if absent.size:  # keys are never deleted, so an empty first slot means no endpoint holds the key: every
            n = int(absent[0])  # prefix ends before it, and the rows after it need no probing
            k, slot, seen = k[:n], slot[:n], seen[:n]
        miss = seen != k  # every slot left is occupied: a miss is another key there, probe on
        masks = self._masks[slot]
        masks[miss] = 0
        todo = np.flatnonzero(miss)
        for _ in range(MAX_PROBE - 1):
            if not len(todo):
                break
            slot[todo] = (slot[todo] + 1) & self._mask_c
            seen = self._keys[slot[todo]]
            found = seen == k[todo]
            if found.any():
                masks[todo[found]] = self._masks[slot[todo[found]]]
            todo = todo[~found & (seen != 0)]
        return masks


def _row_counts(held: U64Array) -> Counts:
    """Per bit of `held` (n rows × W words, each row's bits a subset of the row above), how many rows it is set in:
    that is the row where it drops, so the endpoint's prefix length.

    The rows unpack to one byte per bit, viewed as 8 byte lanes per uint64; a sum of up to 255 rows cannot carry
    from one lane into the next, so one uint64 matmul with a row of ones counts every bit at once."""
    n = held.shape[0]
    lanes = np.unpackbits(held.view(np.uint8).reshape(-1), bitorder="little").view(np.uint64).reshape(n, -1)
    if n <= _LANE_ROWS:
        counts: Counts = (_ONES[:n] @ lanes).view(np.uint8)
        return counts
    parts = np.add.reduceat(lanes, np.arange(0, n, _LANE_ROWS), axis=0)  # lanes of ≤ 255 rows each
    total: Counts = parts.view(np.uint8).reshape(len(parts), -1).sum(axis=0, dtype=np.uint64)
    return total


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
