"""The shared-memory block table answers exactly what the index answers, through rebuilds and any endpoint count."""

from __future__ import annotations

import json
import mmap
import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.shared import SharedBlockTable, TableWriter

_RNG = random.Random(11)
TOKENS = [_RNG.randrange(128_000) for _ in range(16 * 24)]


def _buffers() -> tuple[dict[int, bytearray], Callable[[int, int], bytearray]]:
    made: dict[int, bytearray] = {}

    def alloc(generation: int, nbytes: int) -> bytearray:
        made[generation] = bytearray(nbytes)
        return made[generation]

    return made, alloc


def _from_table(index: KvBlockIndex, table: SharedBlockTable, keys: list[int]) -> dict[str, int]:
    counts = table.prefix_blocks(np.asarray(keys, dtype=np.uint64))
    names = index.slot_names()
    return {names[i]: int(c) for i, c in enumerate(counts) if c and i < len(names) and names[i] is not None}  # type: ignore[misc]


def _stored(first: int, n: int, parent: int | None) -> BlockStored:
    return BlockStored(list(range(first, first + n)), parent, TOKENS[first * 16 : (first + n) * 16], 16, None, "GPU")


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 70), st.sampled_from(["store", "extend", "remove", "clear"]), st.integers(1, 6)),
        max_size=40,
    )
)
def test_the_table_matches_the_index_after_any_events(ops: list[tuple[int, str, int]]) -> None:
    index = KvBlockIndex()
    made, alloc = _buffers()
    writer = TableWriter(index, alloc, capacity=16)  # tiny: rebuilds happen
    for endpoint, op, n in ops:
        name = f"127.10.0.{endpoint}:8000"
        have = index.blocks(name)
        if op == "store":
            index.apply(name, [_stored(0, n, None)], 1.0)
        elif op == "extend" and have:
            index.apply(name, [_stored(have, n, have - 1)], 1.0)
        elif op == "remove" and have:
            index.apply(name, [BlockRemoved([have - 1], "GPU")], 1.0)
        elif op == "clear":
            index.apply(name, [AllBlocksCleared()], 1.0)
    keys = index.request_keys(TOKENS)
    assert _from_table(index, writer.table, keys) == index.match(keys)
    # a second view of the same bytes (as another process maps the segment) reads the same, without a copy
    again = SharedBlockTable(made[writer.table.generation])
    assert _from_table(index, again, keys) == index.match(keys)


def test_a_full_table_is_rebuilt_larger_and_the_old_one_retired() -> None:
    index = KvBlockIndex()
    _, alloc = _buffers()
    writer = TableWriter(index, alloc, capacity=16)
    first = writer.table
    index.apply("127.10.0.1:8000", [_stored(0, 20, None)], 1.0)
    assert writer.table.generation > 0 and first.retired and not writer.table.retired
    assert writer.table.capacity >= 40
    keys = index.request_keys(TOKENS)
    assert _from_table(index, writer.table, keys) == {"127.10.0.1:8000": 20}


def test_more_than_64_endpoints_widen_the_masks() -> None:
    index = KvBlockIndex()
    _, alloc = _buffers()
    writer = TableWriter(index, alloc)
    for e in range(130):
        index.apply(f"127.10.1.{e}:8000", [_stored(0, 1 + e % 3, None)], 1.0)
    assert writer.table.words == 3
    keys = index.request_keys(TOKENS)
    assert _from_table(index, writer.table, keys) == index.match(keys)
    assert len(index.match(keys)) == 130


def test_a_memory_file_mapped_apart_reads_the_writers_table() -> None:
    """The table over a memfd, as the feeder child makes it; a second mapping of the same file (what the serving
    process holds) sees the writes as they land."""
    from epp.supervision.memory import new_memfd

    files: list[tuple[int, mmap.mmap]] = []

    def alloc(generation: int, nbytes: int) -> memoryview:
        fd = new_memfd(f"test-table-{generation}", nbytes)
        files.append((fd, mmap.mmap(fd, nbytes)))
        return memoryview(files[-1][1])

    index = KvBlockIndex()
    writer = TableWriter(index, alloc)
    try:
        index.apply("127.10.0.9:8000", [_stored(0, 5, None)], 1.0)
        fd = files[-1][0]
        mapped = mmap.mmap(fd, os.fstat(fd).st_size)
        reader = SharedBlockTable(memoryview(mapped))
        keys = index.request_keys(TOKENS)
        assert _from_table(index, reader, keys) == {"127.10.0.9:8000": 5}
        index.apply("127.10.0.9:8000", [BlockRemoved([4], "GPU")], 2.0)  # the reader sees writes as they land
        assert _from_table(index, reader, keys) == {"127.10.0.9:8000": 4}
        del reader
    finally:
        del writer
        index.mirror = None
        for fd, _ in files:
            os.close(fd)


_READ_IN_CHILD = """
import json, sys
import numpy as np
from epp.kvevents.publish import TableReader
directory, keys, tables = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
reader = TableReader(directory)
for generation, fd in tables:
    reader.add(generation, fd)
counts = reader.prefix_blocks(np.asarray(keys, dtype=np.uint64))
print(json.dumps({i: int(c) for i, c in enumerate(counts) if c}))
reader.close()
"""


def _read_in_child(directory: int, keys: list[int], tables: dict[int, int]) -> dict[int, int]:
    """Another process's reading of the table: it inherits the directory and the tables announced so far."""
    fds = (directory, *tables.values())
    argv = [sys.executable, "-c", _READ_IN_CHILD, str(directory), json.dumps(keys), json.dumps(list(tables.items()))]
    out = subprocess.run(argv, pass_fds=fds, capture_output=True, timeout=60, check=True)
    return {int(k): v for k, v in json.loads(out.stdout).items()}


@pytest.mark.process
def test_another_process_reads_the_published_table_and_follows_its_rebuilds() -> None:
    from epp.kvevents.publish import SegmentAllocator, TableReader, new_directory

    directory = new_directory()
    reader = TableReader(directory)  # stays attached across the rebuild below
    tables: dict[int, int] = {}  # generation → a descriptor of its table, as the pipe would pass it

    def announce(generation: int, fd: int) -> None:
        tables[generation] = os.dup(fd)
        reader.add(generation, fd)

    index = KvBlockIndex()
    segments = SegmentAllocator(directory, announce)
    writer = TableWriter(index, segments, capacity=16, published=segments.published)
    try:
        index.apply("127.10.0.1:8000", [_stored(0, 3, None)], 1.0)
        keys = index.request_keys(TOKENS)
        counts = reader.prefix_blocks(np.asarray(keys, dtype=np.uint64))
        assert counts is not None and counts[0] == 3
        assert _read_in_child(directory, keys, tables) == {0: 3}
        index.apply("127.10.0.2:8000", [_stored(0, 20, None)], 1.0)  # rebuilds: a new generation
        assert writer.table.generation > 0
        assert _read_in_child(directory, keys, tables) == {0: 3, 1: 20}
        counts = reader.prefix_blocks(np.asarray(keys, dtype=np.uint64))
        assert counts is not None and counts[1] == 20  # followed the new generation
    finally:
        reader.close()
        index.mirror = None
        del writer
        segments.close()
        for fd in (directory, *tables.values()):
            os.close(fd)
    if os.path.isdir("/dev/shm"):
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("epp-")]  # memfd: no name, ever


def _table_and_index(holders: dict[int, int], endpoints: int, capacity: int = 16) -> tuple[KvBlockIndex, TableWriter]:
    """An index whose holder masks are given outright (any keys, not only chain keys) and its table."""
    index = KvBlockIndex()
    for e in range(endpoints):
        index.add_endpoint(f"127.10.2.{e}:8000")
    writer = TableWriter(index, _buffers()[1], capacity=capacity)
    for key, mask in holders.items():
        index.holders[key] = mask
        writer({key: mask})
    return index, writer


# 24 keys in the last bucket at every capacity up to 2^40 (top 40 bits all ones): more than a bucket holds, so some
# go past it and wrap to the first; keys next to 0 and 2^64 (1 is the smallest: every block key is odd); the rest
# random
_TOP = 0xFF_FFFF_FFFF
_KEYS = (
    [(_TOP << 24) | (j << 1) | 1 for j in range(24)]
    + [1, 3, (3 << 62) | 1, (1 << 64) - 1, (1 << 64) - 3]
    + [random.Random(j).getrandbits(64) | 1 for j in range(20)]
)


@settings(max_examples=80, deadline=None)
@given(
    masks=st.lists(st.integers(0, (1 << 130) - 1), min_size=len(_KEYS), max_size=len(_KEYS)),
    endpoints=st.sampled_from([3, 64, 65, 130]),
    prompt=st.lists(st.integers(0, len(_KEYS) + 3), min_size=0, max_size=40),
    keep=st.integers(0, len(_KEYS)),
)
def test_the_table_matches_the_index_for_any_keys_masks_and_prompts(
    masks: list[int], endpoints: int, prompt: list[int], keep: int
) -> None:
    """Probe chains, keys absent mid-prompt (indexes past the pool), masks over one to three words."""
    full = (1 << endpoints) - 1
    holders = {k: m & full for k, m in zip(_KEYS[:keep], masks, strict=False)}
    index, writer = _table_and_index(holders, endpoints)
    absent = [random.Random(99 + j).getrandbits(64) | 1 for j in range(4)]
    keys = [_KEYS[i] if i < len(_KEYS) else absent[i - len(_KEYS)] for i in prompt]
    assert _from_table(index, writer.table, keys) == index.match(keys)


def test_an_even_key_is_refused_and_real_keys_are_odd() -> None:
    index, writer = _table_and_index({}, 1)
    with pytest.raises(ValueError, match="odd"):
        writer.table.set(2, 1)
    assert all(k & 1 for k in index.request_keys(TOKENS))


def test_key_one_is_found_like_any_other() -> None:
    index, writer = _table_and_index({1: 0b101, 5: 0b100}, 3)
    assert (
        _from_table(index, writer.table, [1, 5]) == index.match([1, 5]) == {"127.10.2.0:8000": 1, "127.10.2.2:8000": 2}
    )


def test_a_prompt_longer_than_255_blocks_counts_past_one_byte() -> None:
    keys = [random.Random(j).getrandbits(64) | 1 for j in range(700)]
    same, writer = _table_and_index(dict.fromkeys(keys, 0b011), 2, capacity=1 << 12)  # no bit drops
    assert _from_table(same, writer.table, keys) == {"127.10.2.0:8000": 700, "127.10.2.1:8000": 700}
    holders = {k: 0b011 if i < 600 else 0b001 for i, k in enumerate(keys)}
    index, writer = _table_and_index(holders, 2, capacity=1 << 12)
    assert (
        _from_table(index, writer.table, keys) == index.match(keys) == {"127.10.2.0:8000": 700, "127.10.2.1:8000": 600}
    )


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(st.integers(0, 70), st.sampled_from(["store", "extend", "remove", "clear"]), st.integers(1, 6)),
            min_size=1,
            max_size=8,
        ),
        max_size=10,
    )
)
def test_the_table_matches_the_index_after_every_batch_of_mixed_events(
    batches: list[list[tuple[int, str, int]]],
) -> None:
    """The writer is told each batch's changes once: stores, extensions, removals and clears of several endpoints
    mixed in one batch (an endpoint's events in one `apply`), rebuilds in the middle of it."""
    index = KvBlockIndex()
    made, alloc = _buffers()
    writer = TableWriter(index, alloc, capacity=16)
    keys = index.request_keys(TOKENS)
    for batch in batches:
        by_endpoint: dict[str, list[Any]] = {}
        have: dict[str, int] = {}
        for endpoint, op, n in batch:
            name = f"127.10.0.{endpoint}:8000"
            events = by_endpoint.setdefault(name, [])
            held = have.setdefault(name, index.blocks(name))
            if op == "store":
                events.append(_stored(0, n, None))
                have[name] = max(held, n) if held else n
            elif op == "extend" and held:
                events.append(_stored(held, n, held - 1))
                have[name] = held + n
            elif op == "remove" and held:
                events.append(BlockRemoved([held - 1], "GPU"))
                have[name] = held - 1
            elif op == "clear":
                events.append(AllBlocksCleared())
                have[name] = 0
        for name, events in by_endpoint.items():
            index.apply(name, events, 1.0)
            assert _from_table(index, writer.table, keys) == index.match(keys)
    assert _from_table(index, SharedBlockTable(made[writer.table.generation]), keys) == index.match(keys)


def _recording(index: KvBlockIndex, writer: TableWriter) -> list[dict[int, int]]:
    told: list[dict[int, int]] = []

    def mirror(changes: Any) -> None:
        told.append(dict(changes))
        writer(changes)

    index.mirror = mirror
    return told


def test_a_block_stored_and_removed_in_one_batch_is_told_once_and_never_written() -> None:
    index = KvBlockIndex()
    _, alloc = _buffers()
    writer = TableWriter(index, alloc)
    told = _recording(index, writer)
    a = "127.10.0.1:8000"
    # 12 blocks, the last removed, a different block 11 after block 10: 13 keys changed, more than `set` takes alone
    index.apply(a, [_stored(0, 12, None), BlockRemoved([11], "GPU"), _stored(12, 1, 10)], 1.0)
    keys = index.request_keys(TOKENS)
    assert len(told) == 1 and sorted(told[0].values()) == [0] + [1] * 12  # block 11's key: once, with nobody
    assert _from_table(index, writer.table, keys) == index.match(keys) == {a: 11}
    assert writer.table._used == 12  # the key nobody holds took no slot
    index.apply(a, [_stored(0, 2, None), BlockRemoved([0, 1], "GPU"), _stored(0, 1, None)], 2.0)
    assert _from_table(index, writer.table, keys) == index.match(keys) == {a: 1}


def test_all_blocks_cleared_in_the_middle_of_a_batch() -> None:
    index = KvBlockIndex()
    _, alloc = _buffers()
    writer = TableWriter(index, alloc)
    told = _recording(index, writer)
    a, b = "127.10.0.1:8000", "127.10.0.2:8000"
    index.apply(b, [_stored(0, 4, None)], 1.0)
    index.apply(a, [_stored(0, 5, None), AllBlocksCleared(), _stored(0, 2, None)], 1.0)
    keys = index.request_keys(TOKENS)
    assert _from_table(index, writer.table, keys) == index.match(keys) == {a: 2, b: 4}
    assert len(told) == 2 and len(told[1]) == 5  # each of a's keys once, with its mask after the batch
    index.apply(a, [_stored(2, 3, 1), AllBlocksCleared()], 2.0)
    assert _from_table(index, writer.table, keys) == index.match(keys) == {b: 4}


def test_a_rebuild_in_the_middle_of_a_batch_keeps_every_change() -> None:
    index = KvBlockIndex()
    _, alloc = _buffers()
    writer = TableWriter(index, alloc, capacity=16)
    a, b = "127.10.0.1:8000", "127.10.0.2:8000"
    index.apply(a, [_stored(0, 6, None)], 1.0)
    assert writer.table.generation == 0
    # 18 more keys than a 16-slot table takes, with removals and a second endpoint's blocks around them
    index.apply(a, [_stored(6, 12, 5), BlockRemoved([0], "GPU"), _stored(18, 6, 17), BlockRemoved([23], "GPU")], 2.0)
    index.apply(b, [_stored(0, 20, None), BlockRemoved([19], "GPU")], 2.0)
    assert writer.table.generation > 0
    keys = index.request_keys(TOKENS)
    assert _from_table(index, writer.table, keys) == index.match(keys) == {b: 19}
    assert _from_table(index, writer.table, keys[1:]) == index.match(keys[1:]) == {a: 22, b: 18}  # a lost block 0
    index.apply(a, [_stored(0, 1, None)], 3.0)
    assert _from_table(index, writer.table, keys) == index.match(keys) == {a: 23, b: 19}


@settings(max_examples=80, deadline=None)
@given(
    first=st.lists(st.integers(0, (1 << 130) - 1), min_size=len(_KEYS), max_size=len(_KEYS)),
    second=st.dictionaries(st.integers(0, len(_KEYS) - 1), st.integers(0, (1 << 130) - 1)),
    endpoints=st.sampled_from([3, 64, 65, 130]),
    prompt=st.lists(st.integers(0, len(_KEYS) + 3), min_size=0, max_size=40),
    keep=st.integers(0, len(_KEYS)),
)
def test_many_keys_written_at_once_read_as_written_one_by_one(
    first: list[int], second: dict[int, int], endpoints: int, prompt: list[int], keep: int
) -> None:
    """`set_many` (one write's changes at once): full home buckets, a bucket's keys placed past it and wrapping,
    masks over one to three words, then some of them changed, dropped to nobody, or new, in a second call."""
    full = (1 << endpoints) - 1
    index = KvBlockIndex()
    for e in range(endpoints):
        index.add_endpoint(f"127.10.2.{e}:8000")
    writer = TableWriter(index, _buffers()[1], capacity=16)
    for changes in (
        {k: m & full for k, m in zip(_KEYS[:keep], first, strict=False)},
        {_KEYS[i]: m & full for i, m in second.items()},
    ):
        for key, mask in changes.items():
            if mask:
                index.holders[key] = mask
            else:
                index.holders.pop(key, None)
        writer(changes)
    absent = [random.Random(99 + j).getrandbits(64) | 1 for j in range(4)]
    keys = [_KEYS[i] if i < len(_KEYS) else absent[i - len(_KEYS)] for i in prompt]
    assert _from_table(index, writer.table, keys) == index.match(keys)
    one_by_one, single = _table_and_index(dict(index.holders), endpoints)
    assert _from_table(one_by_one, single.table, keys) == _from_table(index, writer.table, keys)
