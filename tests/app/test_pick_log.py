"""The serving workers' shared log of picks: each worker writes its own ring, every other reads it; a repeat of a
prompt taken by another worker goes where the first went."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.app.mirror_table import MATRIX_COLUMNS, MirrorTable
from epp.app.pick_log import CAPACITY, MAX_HASHES, NATIVE, RECORD_WORDS, PickLog, ring_words
from epp.app.worker import IDLE_S, REFRESH_S, _learn, _sharing, idle_wait
from epp.datastore.rows import NCOL, TOKEN
from epp.datastore.table import EndpointInfo
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler
from epp.scheduling.prefix import PrefixCacheScorer, learn_pick


def block(workers: int) -> np.ndarray:
    return np.zeros(ring_words(workers), dtype=np.int64)


def test_a_worker_reads_the_others_records_not_its_own() -> None:
    shared = block(3)
    a, b, c = PickLog(shared, 3, 0), PickLog(shared, 3, 1), PickLog(shared, 3, 2)
    a.append(0, 5, 11, [1, 2, 3])
    b.append(1, 6, 12, [2**64 - 1])  # hashes are unsigned 64-bit
    assert list(c.read()) == [(0, 5, 11, [1, 2, 3]), (1, 6, 12, [2**64 - 1])]
    assert list(a.read()) == [(1, 6, 12, [2**64 - 1])]
    assert list(c.read()) == []  # each record once
    a.append(0, 1, 1, list(range(MAX_HASHES + 10)))
    ((_, _, _, hashes),) = list(c.read())
    assert hashes == list(range(MAX_HASHES))  # bounded: the leading blocks are what a prefix match uses


def test_a_lapped_reader_skips_what_was_overwritten_and_counts_it() -> None:
    shared = block(2)
    writer, reader = PickLog(shared, 2, 0), PickLog(shared, 2, 1)
    for i in range(CAPACITY + 7):
        writer.append(0, i % 16, 0, [i])
    records = list(reader.read())
    assert len(records) == CAPACITY and records[0][3] == [7] and records[-1][3] == [CAPACITY + 6]
    assert reader.lost == 7


def test_a_record_being_written_is_not_taken() -> None:
    shared = block(2)
    writer, reader = PickLog(shared, 2, 0), PickLog(shared, 2, 1)
    writer.append(0, 3, 0, [9])
    writer._rings[0, 0, 0] = -1  # what a reader sees while the writer rewrites the slot (lapped mid-read)
    assert list(reader.read()) == [] and reader.lost == 1


def test_a_restarted_worker_learns_the_others_recent_picks() -> None:
    shared = block(2)
    PickLog(shared, 2, 0).append(0, 3, 4, [7, 8])
    assert list(PickLog(shared, 2, 1).read()) == [(0, 3, 4, [7, 8])]


def members(n: int) -> list[tuple[int, float, EndpointInfo, list[str], list[str]]]:
    return [(slot, float(10 + slot), EndpointInfo(f"127.10.0.{slot + 1}:8000"), [], []) for slot in range(n)]


def test_a_repeat_taken_by_another_worker_goes_where_the_first_went() -> None:
    """Two workers of the default profile over one pool: without the log the second worker's index has never seen
    the prompt; with it, the second worker's prefix scorer sends the repeat to the first worker's endpoint."""
    workers, endpoints = 2, 8
    rows = np.zeros((16, NCOL))
    rows[:, TOKEN] = -1.0
    matrix = np.zeros((workers, 16, MATRIX_COLUMNS), dtype=np.int64)
    shared = block(workers)
    stats = np.zeros((workers, 4), dtype=np.int64)
    sides = []
    for me in range(workers):
        table = MirrorTable(rows, matrix, me)
        table.mirror(members(endpoints))
        table.synced = True
        scheduler = build_scheduler(None, seed=me)
        log = PickLog(shared, workers, me)
        scorers = scheduler.prefix_scorers
        assert len(scorers) == 1
        for position, scorer in enumerate(scorers):
            scorer.on_pick = _sharing(log, table, position)
        sides.append((table, scheduler, log, scorers))

    def pick(side: int, prompt: str) -> str:
        table, scheduler, _, _ = sides[side]
        request = InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="m", prompt=prompt)
        snapshot = table.snapshot()
        slots = scheduler.handler.pick(snapshot, np.flatnonzero(snapshot.present), request, 0.0)
        return snapshot.addresses[slots[0]]

    prompts = [f"customer {k}: " + f"context of customer {k}. " * 60 for k in range(12)]
    first = [pick(0, p) for p in prompts]
    table_b, _, log_b, scorers_b = sides[1]
    _learn(log_b, table_b, scorers_b, stats[1])
    assert stats[1, 2] == len(prompts) and stats[1, 3] == 0
    again = [pick(1, p + " and a new question") for p in prompts]
    assert again == first


_CHAINS = [[(chain << 8) | depth for depth in range(1, 9)] for chain in range(3)]


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(1, 4), st.integers(1, 3)), max_size=12),
        max_size=8,
    ),
    capacity=st.sampled_from([2, 6, 12]),
)
def test_a_batch_learned_leaves_the_index_as_each_pick_learned_in_turn_does(
    batches: list[list[tuple[int, int, int, int]]], capacity: int
) -> None:
    """`_learn` skips a record equal to one it learned since that slot last changed, when learning that one changed
    nothing (a repeated prompt); the index ends exactly as `learn_pick` on every record, one after another, leaves
    it. Repeats come in runs and interleaved over the slots, and the generations turn (small capacities)."""
    rows = np.zeros((16, NCOL))
    rows[:, TOKEN] = -1.0
    matrix = np.zeros((2, 16, MATRIX_COLUMNS), dtype=np.int64)
    table = MirrorTable(rows, matrix, 1)
    table.mirror(members(3))
    table.synced = True
    shared, stats = block(2), np.zeros((2, 4), dtype=np.int64)
    writer, reader = PickLog(shared, 2, 0), PickLog(shared, 2, 1)
    fast = PrefixCacheScorer(lru_capacity=capacity, auto_tune=False)
    definition = PrefixCacheScorer(lru_capacity=capacity, auto_tune=False)
    picks = 0
    for batch in batches:
        for slot, chain, depth, times in batch:
            for _ in range(times):
                writer.append(0, slot, 10 + slot, _CHAINS[chain][:depth])
                local = table.local_of(slot, 10 + slot)
                assert local is not None
                learn_pick(definition.index, table.view(), local, _CHAINS[chain][:depth], auto_tune=False)
                picks += 1
        _learn(reader, table, [fast], stats[1])
        a, b = fast.index, definition.index
        assert (a._holders, a._young, a._old, a._owner) == (b._holders, b._young, b._old, b._owner)
    assert stats[1, 2] == picks


def test_an_idle_worker_reads_the_log_before_a_fast_writer_laps_its_ring() -> None:
    """With no decision, a worker reads the others' picks every `IDLE_S`, or often enough that a writer keeping its
    last rate fills a quarter of a ring meanwhile: at 20,000 picks a second, every 12.8 ms, not every 0.5 s (by
    when 10,000 picks would have lapped a 1,024-record ring); an idle pool still waits `IDLE_S`."""
    assert idle_wait(0, 0.5) == IDLE_S
    assert idle_wait(100, 0.5) == IDLE_S  # 200 picks a second: 100 meanwhile, far from a lap
    for rate in (2_000, 20_000, 200_000):
        wait = idle_wait(rate // 2, 0.5)
        assert wait * rate <= CAPACITY / 4 or wait == REFRESH_S
    assert idle_wait(10**9, 0.5) == REFRESH_S  # never a busy loop


@pytest.mark.skipif(NATIVE is None, reason="the pick log's extension is not built")
@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "append", "read", "tear", "rewind"]),
            st.integers(0, 2),  # the worker that appends or reads, or the ring torn or rewound
            st.integers(0, 3),  # scorer position
            st.integers(0, 2**40),  # control slot
            st.one_of(
                st.lists(st.integers(0, 2**64 - 1), max_size=MAX_HASHES + 3),
                st.sampled_from([[], [2**64 - 1, 2**60, 2**30 - 1], list(range(MAX_HASHES))]),  # repeated prompts
            ),
            st.integers(1, CAPACITY // 3),  # appends in a row (laps), or the record torn
        ),
        max_size=30,
    )
)
def test_the_compiled_log_writes_and_reads_what_the_python_definition_does(
    steps: list[tuple[str, int, int, int, list[int], int]],
) -> None:
    """`append` and `read` through the extension leave the block, and read back the records and the losses, exactly
    as `append_python` and `read_python` do: laps, long and 64-bit hashes, records torn mid-read, writers restarted
    from an older head, repeated prompts (one list for equal hashes in a row)."""
    workers = 3
    blocks = (block(workers), block(workers))
    logs = [
        [PickLog(b, workers, me, native=kernels) for me in [*range(workers), -1]]  # -1: the control process's
        for b, kernels in zip(blocks, (NATIVE, None), strict=True)
    ]
    for kind, worker, position, slot, hashes, times in steps:
        if kind == "append":
            for i in range(times):
                for side in logs:
                    side[worker].append(position, slot, i, hashes)
        elif kind == "read":
            reader = worker if position < 3 else -1  # a worker's end, or the control process's (every ring)
            native_log, python_log = logs[0][reader], logs[1][reader]
            assert list(native_log.read()) == list(python_log.read())
            assert native_log.lost == python_log.lost
        elif kind == "tear":
            for b in blocks:
                b[workers + (worker * CAPACITY + times) * RECORD_WORDS] = -1  # a record being rewritten
        else:
            for b in blocks:
                b[worker] = b[worker] * times // CAPACITY  # a restarted writer, from an older head
        assert np.array_equal(blocks[0], blocks[1])


@pytest.mark.skipif(NATIVE is None, reason="the pick log's extension is not built")
def test_the_compiled_log_refuses_a_hash_out_of_range_before_writing() -> None:
    shared = block(2)
    log = PickLog(shared, 2, 0)
    with pytest.raises(OverflowError):
        log.append(0, 1, 1, [1, 2**64])
    with pytest.raises(OverflowError):
        log.append(0, 1, 1, [-1])
    assert not shared.any()


def test_a_record_names_an_endpoint_by_its_control_slot_and_token() -> None:
    """`MirrorTable.local_of` (and `by_name`, which `_learn` reads): our slot for the control slot while it holds
    the endpoint of that token; a slot that left, a reused slot's old token, a slot out of range: none."""
    rows = np.zeros((16, NCOL))
    rows[:, TOKEN] = -1.0
    table = MirrorTable(rows, np.zeros((2, 16, MATRIX_COLUMNS), dtype=np.int64), 1)
    table.mirror(members(3))
    held = [table.local_of(control, 10 + control) for control in range(3)]
    assert None not in held and sorted(held) == sorted(set(held))  # type: ignore[type-var]
    assert table.local_of(1, 11) == table.slot_of("127.10.0.2:8000")
    table.mirror(
        [(0, 10.0, EndpointInfo("127.10.0.1:8000"), [], []), (1, 21.0, EndpointInfo("127.9.0.9:8000"), [], [])]
    )
    assert table.local_of(1, 11) is None and table.local_of(1, 21) == table.slot_of("127.9.0.9:8000")
    assert table.local_of(2, 12) is None and table.local_of(-1, 10) is None and table.local_of(99, 10) is None
    assert table.local_of(0, 10) == table.slot_of("127.10.0.1:8000")


def test_every_ring_of_many_workers_is_read() -> None:
    """No bound on the workers a reader follows (80 rings here): each worker's record, once, in ring order."""
    workers = 80
    shared = block(workers)
    logs = [PickLog(shared, workers, me) for me in range(workers)]
    for me, log in enumerate(logs):
        log.append(0, me, me, [me, 2**64 - 1])
    assert logs[0].read() == [(0, me, me, [me, 2**64 - 1]) for me in range(1, workers)]
    assert logs[0].read() == []
