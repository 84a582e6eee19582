"""The block index as a flat table another process reads without copying: one writer, lock-free readers.

Layout of one buffer (a memfd mapping in production, epp.kvevents.publish; any writable buffer in tests), all
little-endian uint64:

    header[8]           magic, capacity C (a power of two, ≥ BUCKET), mask words W, generation, used slots, retired,
                        2 spare
    keys[C]             a block key per slot; 0 = empty; C / BUCKET buckets of BUCKET consecutive slots
    masks[C × W]        the endpoints holding that block, one bit per endpoint slot

Block keys are odd by construction (`epp.kvevents.blockkeys`: their 2^-63 collision per pair of blocks is the
price), so 0 is never a key and marks an empty slot with no fix-up on either side; `set` refuses an even key.
A key's home bucket is its top log2(C / BUCKET) bits (`_home`: one shift, the one definition for the writer and
the reader): the keys are already mixed, so their high bits are as uniform as any hash of them. The writer puts a
key in the first empty slot of its home bucket; only when that bucket is full does it go on to the next buckets
(at most `MAX_PROBE` of them). With the table at most half full, a bucket of 16 overflows for about 0.1 % of keys,
so a reader finds nearly every key in its home bucket, and a key missing from a home bucket that is not full is
in no endpoint's cache.

Nothing is ever deleted: a block no endpoint holds keeps its slot with mask 0, which reads as a miss. So a slot's
key, once written, never changes, and the writer writes a new slot's mask before its key: a reader that sees the
key sees a mask that was true at some moment. That relies on the stores reaching the reader in program order and on
the reader loading a key before its mask: numpy and the C kernel issue plain stores and loads, with no fence, which
x86-64 keeps in order (total store order) and aarch64 does not; a port to a weakly ordered CPU needs a release store
of the key and an acquire load of it (the seqlocked rows say the same: epp.datastore.rows).
A mask word is one aligned 8-byte store, so each endpoint's bit is
either the old or the new value, never torn; a pick that races a write sees the block one event early or late, as
it would a scrape row. When the table runs out of room (half full, or `MAX_PROBE` full buckets in a row), `set`
returns False and the owner (`TableWriter`) rebuilds a larger table from its index into a new buffer, generation
+ 1, and marks the old one retired, which readers check once per pick to move on to the next generation's segment.

Reading is vectorised, a dozen numpy calls whatever the endpoint count and however full the table: every key's
home bucket gathered at once and compared with the key; the prompt's leading keys found there; the first key not
found ends every prefix, unless its bucket is full (then that key alone is looked for further on, in Python: rare).
The masks are ANDed cumulatively down the prompt, and since a bit that drops never comes back, each endpoint's
prefix is the number of rows its bit is set in (`_row_counts`).
Where the compiled kernels are built (`epp.kvevents.kernels`), the same walk runs in C in one call, a slot's key
loaded before its mask; this numpy reader is its definition and its fallback, and tests hold the two equal.
`KvBlockIndex.match` walks Python dicts instead; both answer the same question with the same keys, tests hold them
equal, and benchmarks/kv_events.py measures both side by side.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from epp.kvevents import kernels
from epp.kvevents.blockkeys import U64Array
from epp.kvevents.index import KvBlockIndex

MAGIC: Final = 0x4B56_424C_4B53_0003  # "KVBLKS" v3: odd keys as they are, buckets of 16 by their top bits
HEADER_WORDS: Final = 8
BUCKET: Final = 16  # slots per bucket: two cache lines of keys
_LOG_BUCKET: Final = 4
MAX_PROBE: Final = 4  # buckets a key may be from its home bucket
_CAP, _WORDS, _GEN, _USED, _RETIRED = 1, 2, 3, 4, 5
# rows summed at once in `_row_counts`: one byte per endpoint bit holds a count up to 255
_LANE_ROWS: Final = 255
_ONES = np.ones(_LANE_ROWS, dtype=np.uint64)
_ROWS = np.arange(1 << 13, dtype=np.int64)  # row numbers (a request has at most max_request_blocks keys)
_LOG_B = np.int64(_LOG_BUCKET)
_IN_BUCKET = np.int64(BUCKET - 1)
# `set_many`: below this many keys the scalar `set` per key is cheaper than its dozen numpy calls; above the chunk,
# the keys go in chunks (the gathered buckets of a chunk are 128 bytes a key)
_FEW: Final = 8
_CHUNK: Final = 1 << 16
_WORD = (1 << 64) - 1
Counts = npt.NDArray[np.unsignedinteger[Any]]


def _home(key: int, shift: int) -> int:
    """A key's home bucket: its top log2(buckets) bits (the reader shifts a whole array the same way)."""
    return key >> shift


def _words(values: Sequence[int]) -> U64Array:
    """Python ints (0 ≤ v < 2^64) as uint64, through array.array: several times cheaper than numpy's per-element
    conversion of a list (`BlockKeys.tokens_array` does the same for token ids)."""
    return np.frombuffer(array.array("Q", values), dtype=np.uint64)


def table_bytes(capacity: int, words: int) -> int:
    return 8 * (HEADER_WORDS + capacity + capacity * words)


class SharedBlockTable:
    """A view over one buffer; `create=True` lays out an empty table, otherwise the buffer's header is read."""

    def __init__(
        self, buf: memoryview | bytearray, capacity: int = 0, words: int = 1, create: bool = False, generation: int = 0
    ) -> None:
        whole = np.frombuffer(buf, dtype="<u8")
        if create:
            if capacity < BUCKET or capacity & (capacity - 1):
                raise ValueError(f"capacity must be a power of two, at least {BUCKET}")
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
        self._buckets = self._keys.reshape(c // BUCKET, BUCKET)
        self._masks = whole[HEADER_WORDS + c : HEADER_WORDS + c + c * w].reshape(c, w)
        self._bucket_masks = self._masks.reshape(c // BUCKET, BUCKET, w)
        self._shift = 64 - ((c // BUCKET).bit_length() - 1)
        self._shift_u = np.uint64(self._shift)
        self._last_bucket = c // BUCKET - 1
        self._used = int(whole[_USED])
        self._claim: npt.NDArray[np.int64] | None = None  # the writer's scratch: a bucket's new key in a round
        self._native = kernels.NATIVE  # the compiled reader, or None: the numpy one in `prefix_blocks`
        # the same words as Python ints for the writer's scalar reads and stores, several times cheaper than numpy
        # scalar indexing (one writer process mirrors every block event: benchmarks/kv_events.py feeder_writer);
        # native byte order, which is the layout's little-endian on every platform numpy's "<u8" view runs fast on
        raw = memoryview(buf).cast("B")
        self._header_words = raw[: 8 * HEADER_WORDS].cast("Q")
        self._key_words = raw[8 * HEADER_WORDS : 8 * (HEADER_WORDS + c)].cast("Q")
        self._mask_words = raw[8 * (HEADER_WORDS + c) : 8 * (HEADER_WORDS + c + c * w)].cast("Q")

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
        slot = self._find(key, _home(key, self._shift), insert=True)
        if slot < 0:
            return False
        keys = self._key_words
        if keys[slot] == key:
            self._write_mask(slot, mask)
            return True
        if mask == 0:
            return True  # nobody holds a block we never stored: nothing to write
        used = self._used + 1
        if 2 * used > self.capacity:
            return False
        self._write_mask(slot, mask)
        keys[slot] = key  # after the mask: a reader that sees the key sees its mask
        self._used = self._header_words[_USED] = used
        return True

    def _find(self, key: int, bucket: int, insert: bool = False) -> int:
        """The slot holding `key`, searching from `bucket` on; −1 when absent. With `insert`, an absent key's slot
        is the first empty one (−1: none within `MAX_PROBE` buckets)."""
        words, last = self._key_words, self._last_bucket
        for _ in range(MAX_PROBE):
            base = bucket * BUCKET
            row = words[base : base + BUCKET].tolist()
            if key in row:
                return base + row.index(key)
            if 0 in row:  # a key is only ever put past a full bucket
                return base + row.index(0) if insert else -1
            bucket = bucket + 1 if bucket < last else 0
        return -1

    def _write_mask(self, slot: int, mask: int) -> None:
        words = self.words
        if words == 1:
            self._mask_words[slot] = mask
            return
        for w in range(words):
            self._mask_words[slot * words + w] = (mask >> (64 * w)) & 0xFFFF_FFFF_FFFF_FFFF

    def set_many(self, keys: Sequence[int], masks: Sequence[int]) -> bool:
        """`set` for many keys at once (each at most once; the masks over all W words): what one write of the index
        changed, or a whole index on a rebuild. False when there is no room (some may be written: rebuild larger)."""
        n = len(keys)
        if n <= _FEW:
            return all(self.set(k, m) for k, m in zip(keys, masks, strict=True))
        for start in range(0, n, _CHUNK):
            k = _words(keys[start : start + _CHUNK] if n > _CHUNK else keys)
            if not int(np.bitwise_and.reduce(k)) & 1:  # the AND of odd keys is odd
                raise ValueError(f"block keys are odd, got {int(k[(k & np.uint64(1)) == 0][0]):#x}")
            m = self._mask_rows(masks[start : start + _CHUNK] if n > _CHUNK else masks)
            further = self._place(k, m)
            if further is None:
                return False
            if not all(self.set(int(keys[start + i]), int(masks[start + i])) for i in further):
                return False
        return True

    def _place(self, k: U64Array, m: U64Array) -> list[int] | None:
        """Write what the keys in their home buckets need, in rounds of a dozen numpy calls: a key already there
        gets its masks (one store for all); a new one held by somebody takes its bucket's first empty slot, one new
        key per bucket a round (the others wait for the next), every new slot's masks stored before any new slot's
        key, as `set` does for one. Returns the positions (in `k`) of the keys whose home bucket is full, for `set`
        to look further; None when the table has no room."""
        if not self._used:  # an empty table (a rebuild): every key is new, its place its rank in its home bucket
            held = np.logical_or.reduce(m, axis=1)
            return self._place_new(k[held], m[held], np.flatnonzero(held))
        if self._claim is None:
            self._claim = np.empty(self.capacity // BUCKET, dtype=np.int64)
        claim, further = self._claim, list[int]()
        which: npt.NDArray[np.int64] | None = None  # positions in the caller's keys of this round's (None: all)
        while True:
            home = (k >> self._shift_u).view(np.int64)
            rows = self._buckets[home]
            # each key's own slot in its home bucket if there, else the first empty one (a bucket fills from its
            # first slot: nothing is deleted): the first 0 of min(slot ^ key, slot); none: the bucket is full
            slots = np.minimum(rows ^ k[:, None], rows).argmin(axis=1)
            slots += home << _LOG_B
            at = self._keys[slots]
            present = at == k
            found = np.count_nonzero(present)
            if found == len(k):
                self._masks[slots] = m
                return further
            if found:
                self._masks[slots[present]] = m[present]
            empty = at == 0
            if found + np.count_nonzero(empty) < len(k):  # some home buckets full: those keys may be further on
                full = np.flatnonzero(~(present | empty))
                further.extend((full if which is None else which[full]).tolist())
            empty &= np.logical_or.reduce(m, axis=1)  # absent and held by nobody: nothing to write
            new = np.flatnonzero(empty)
            if not len(new):
                return further
            s = slots[new]
            b = home[new]
            claim[b] = new
            win = claim[b] == new  # one new key per bucket: whichever the store kept
            wait = None if win.all() else new[~win]
            if wait is not None:
                new, s = new[win], s[win]
            used = self._used + len(new)
            if 2 * used > self.capacity:
                return None
            self._masks[s] = m[new]
            self._keys[s] = k[new]  # after every mask: a reader that sees a key sees its mask (x86-64 order)
            self._used = self._header_words[_USED] = used
            if wait is None:
                return further
            k, m = k[wait], m[wait]
            which = wait if which is None else which[wait]

    def _place_new(self, k: U64Array, m: U64Array, which: npt.NDArray[np.int64]) -> list[int] | None:
        """`_place` into an empty table: keys sorted by home bucket, each bucket's first BUCKET in its slots at
        once; the positions of the rest (their home bucket full) are returned for `set`."""
        used = len(k)
        if 2 * used > self.capacity:
            return None
        home = (k >> self._shift_u).view(np.int64)
        order = np.argsort(home)  # any order within a bucket
        h = home[order]
        starts = np.flatnonzero(np.concatenate(([True], h[1:] != h[:-1])))  # each bucket's first key, in order
        rank = np.arange(used) - np.repeat(starts, np.diff(np.append(starts, used)))
        fits = rank < BUCKET
        further: list[int] = which[order[~fits]].tolist()
        if further:
            order, h, rank = order[fits], h[fits], rank[fits]
        slots = (h << _LOG_B) + rank
        self._masks[slots] = m[order]
        self._keys[slots] = k[order]
        self._used = self._header_words[_USED] = len(slots)
        return further

    def _mask_rows(self, masks: Sequence[int]) -> U64Array:
        """Masks (Python ints, < 2^(64·W)) as an n × W array of words."""
        words = self.words
        if words == 1:
            return _words(masks).reshape(-1, 1)
        return np.array([[(mask >> (64 * w)) & _WORD for w in range(words)] for mask in masks], dtype=np.uint64)

    # -- readers ------------------------------------------------------------------------------------------------

    def prefix_blocks(self, keys: U64Array) -> Counts:
        """Per endpoint slot (W × 64 of them), how many of `keys`' leading blocks (odd, as every block key) it
        holds."""
        if self._native is not None:  # the same walk compiled, one call (`_native.c`; tests hold the two equal)
            counts = np.empty(64 * self.words, dtype=np.uint64)
            self._native.prefix_blocks(
                keys, self._keys, self._masks, self.words, self._shift, BUCKET, MAX_PROBE, counts
            )
            return counts
        n = len(keys)
        home = (keys >> self._shift_u).view(np.int64)
        buckets = self._buckets[home]
        # row · BUCKET + position of every key found in its home bucket, ascending: at most one per row
        at = (buckets == keys[:, None]).ravel().nonzero()[0]
        found = len(at)
        if found == n or (found and at[found - 1] < found * BUCKET):
            lead = found  # the first `found` rows, and no other
        elif found:
            numbers = _ROWS[:found] if found <= _ROWS.size else np.arange(found, dtype=np.int64)
            lead = int(((at >> _LOG_B) != numbers).argmax())
        else:
            lead = 0
        if lead < n and buckets[lead, -1]:  # the first key not at home has a full home bucket: look further
            slots = self._past_full_buckets(keys, home, buckets, at)
            if not len(slots):
                return np.zeros(64 * self.words, dtype=np.uint64)
            masks = self._masks[slots]
        elif lead:  # each leading row's mask from its home bucket's masks, at the key's position
            masks = self._bucket_masks[home[:lead]].reshape(lead * BUCKET, self.words)[at[:lead]]
        else:
            return np.zeros(64 * self.words, dtype=np.uint64)
        return _row_counts(np.bitwise_and.accumulate(masks, axis=0))

    def _past_full_buckets(
        self,
        keys: U64Array,
        home: npt.NDArray[np.int64],
        buckets: U64Array,
        at: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """The slots of the leading keys when some were put past their full home bucket: each key not at home is
        looked for in the buckets after it, one by one, until one is in no slot."""
        n = len(keys)
        where = np.full(n, -1, dtype=np.int64)
        rows = at >> _LOG_B
        where[rows] = (home[rows] << _LOG_B) + (at & _IN_BUCKET)
        last = self._last_bucket
        for row in np.flatnonzero(where < 0).tolist():
            if not int(buckets[row, -1]):  # not at home, and home has room: no endpoint holds it
                return where[:row]
            h = int(home[row])
            slot = self._find(int(keys[row]), h + 1 if h < last else 0)
            if slot < 0:
                return where[:row]
            where[row] = slot
        return where


def _row_counts(held: U64Array) -> Counts:
    """Per bit of `held` (n rows × W words, each row's bits a subset of the row above), how many rows it is set in:
    that is the row where it drops, so the endpoint's prefix length.

    When no bit drops (one holder, or all holders to the end: the common case), that is n for the first row's bits.
    Otherwise the rows unpack to one byte per bit, viewed as 8 byte lanes per uint64; a sum of up to 255 rows cannot
    carry from one lane into the next, so one uint64 matmul with a row of ones counts every bit at once."""
    n = held.shape[0]
    if held[0].tolist() == held[-1].tolist():
        bits = np.unpackbits(held[0].view(np.uint8), bitorder="little")
        if n <= _LANE_ROWS:
            bits *= np.uint8(n)
            return bits
        return bits * np.uint64(n)
    lanes = np.unpackbits(held.view(np.uint8).reshape(-1), bitorder="little").view(np.uint64).reshape(n, -1)
    if n <= _LANE_ROWS:
        counts: Counts = (_ONES[:n] @ lanes).view(np.uint8)
        return counts
    parts = np.add.reduceat(lanes, np.arange(0, n, _LANE_ROWS), axis=0)  # lanes of ≤ 255 rows each
    total: Counts = parts.view(np.uint8).reshape(len(parts), -1).sum(axis=0, dtype=np.uint64)
    return total


class TableWriter:
    """Keeps a `SharedBlockTable` equal to an index's holders: install as the index's `mirror`.

    `alloc(generation, nbytes)` returns the buffer for a table (a new memory file for the
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
            holders = self.index.holders
            if table.set_many(list(holders), list(holders.values())):
                if self._published is not None:
                    self._published(generation)  # complete: readers may be pointed at it
                return table
            capacity *= 2

    def __call__(self, changes: Mapping[int, int]) -> None:
        """The index's holder changes of one write ({key: new mask}), into the table; a rebuild when it is full."""
        if not changes:
            return
        table = self.table
        masks = list(changes.values())
        if max(masks) >> (64 * table.words) == 0 and table.set_many(list(changes), masks):
            return
        live = len(self.index.holders)
        capacity = max(table.capacity * 2, 1 << max(_LOG_BUCKET, (4 * live).bit_length()))
        self.table = self._build(capacity, max(table.words, self._words_needed()), table.generation + 1)
        table.retire()
