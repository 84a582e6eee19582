"""The precise producer in serving workers: one feeder (the control process's child) writes the table; each worker
maps the same memory (the descriptors passed on by the control process) and its producer picks from it exactly as
one process's would; a pick that owes an endpoint's stores reaches the other workers through the pick log, with
the pick's own time, so the endpoint turns stale everywhere at once."""

from __future__ import annotations

import os

import numpy as np

from epp.app.kv_feeder import FeederStatus, SharedKvIndex
from epp.app.pick_log import PickLog, ring_words
from epp.app.worker import OwedStores, owed_record
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.kvevents.decode import BlockStored
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.publish import SegmentAllocator, new_directory
from epp.kvevents.shared import TableWriter
from epp.scheduling.framework import CycleState, PrefixMatch, produced
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.producers import TokenProducer
from epp.sim.tokens import token_ids
from tests.scheduling.tables import request

A, B = "127.10.0.1:8000", "127.10.0.2:8000"
PROMPT = " ".join(f"w-{i:05d}" for i in range(600))


def _table() -> EndpointTable:
    table = EndpointTable()
    table.replace_all([EndpointInfo(A), EndpointInfo(B)])
    return table


def _pick(producer: PrecisePrefixCacheProducer, table: EndpointTable, now: float) -> CycleState:
    snap = table.snapshot()
    state = CycleState(snap, snap.slots, request(PROMPT, token_ids=tuple(token_ids(PROMPT))), now)
    TokenProducer(backend="vllm", model_name="m").produce(state)
    producer.produce(state)
    return state


def _stored(tokens: list[int], blocks: int) -> BlockStored:
    return BlockStored(list(range(1, blocks + 1)), None, tokens[: blocks * 16], 16, None, "GPU")


def test_a_workers_producer_picks_as_the_control_processes_from_the_same_shared_table() -> None:
    directory = new_directory()
    control, worker = SharedKvIndex(), SharedKvIndex()
    passed: list[int] = []  # the descriptors as the pipe would pass them to the worker (its own copies)

    def announce(generation: int, fd: int) -> None:
        control.add_table(generation, fd)
        passed.append(os.dup(fd))
        worker.add_table(generation, passed[-1])

    control.use_directory(directory)
    passed.append(os.dup(directory))
    worker.use_directory(passed[-1])
    index = KvBlockIndex(block_size=16)
    segments = SegmentAllocator(directory, announce)
    writer = TableWriter(index, segments, capacity=16, published=segments.published)
    try:
        tokens = list(token_ids(PROMPT))
        index.apply(A, [_stored(tokens, 3)], 1.0)
        index.apply(B, [_stored(tokens, 20)], 1.0)  # more than the first table holds: a rebuild, generation 1
        assert writer.table.generation > 0
        status = FeederStatus(
            writer.table.generation, list(index.slot_names()), {e: index.last_event_at(e) for e in index.endpoints()},
            {}, {},
        )  # fmt: skip
        matches: list[PrefixMatch] = []
        for view in (control, worker):
            view.take_status(status)
            producer = PrecisePrefixCacheProducer(block_size=16)
            producer.attach(view)
            matches.append(produced(_pick(producer, _table(), 2.0), producer.name))
        one, other = matches
        assert one.matched.tolist() == other.matched.tolist() and one.total == other.total
        assert one.matched.tolist()[:2] == [3.0, 20.0]
    finally:
        for view in (control, worker):
            view.drop()
        index.mirror = None
        del writer
        segments.close()
        for fd in (directory, *passed):
            os.close(fd)


def test_a_pick_that_owes_stores_makes_the_endpoint_stale_in_every_worker_from_the_picks_time() -> None:
    block = np.zeros(ring_words(2), dtype=np.int64)
    mine, theirs = PickLog(block, 2, 0), PickLog(block, 2, 1)
    producer = PrecisePrefixCacheProducer(block_size=16, stale_after_s=1.0)
    other = PrecisePrefixCacheProducer(block_size=16, stale_after_s=1.0)
    status = FeederStatus(0, [A, B], {A: 1.0, B: 1.0}, {}, {})  # both heard from at t=1
    for p in (producer, other):
        view = SharedKvIndex()
        view.take_status(status)
        p.attach(view)
    table = _table()
    producer.on_owed = lambda slot, now: mine.append(1, slot, 0, owed_record(now))
    state = _pick(producer, table, 5.0)
    producer.picked(state, 0)  # all of the prompt is new to A: A owes its stores from t=5
    learner = OwedStores(other)
    snap = table.snapshot()
    for position, slot, _, values in theirs.read():
        assert position == 1
        learner.learn(snap, slot, values)  # learned later than the pick: the pick's time counts
    assert other.trust(A, 5.5) is None and other.trust(A, 6.5) == "stale"
    assert producer.trust(A, 6.5) == "stale" and other.trust(B, 6.5) is None


def test_the_control_process_passes_the_feeders_table_on_to_every_worker_and_to_one_that_starts() -> None:
    import asyncio

    from epp.app.kv_feeder import KvDirectory, KvFeederProcess, KvGone
    from epp.app.settings import ServeSettings
    from epp.app.workers import WorkerPool
    from epp.datastore.objectives import ObjectiveStore
    from epp.datastore.pool import FailureMode

    table = _table()
    feeder = KvFeederProcess(table, PrecisePrefixCacheProducer(block_size=16))
    pool = WorkerPool(
        2, ServeSettings(), table, ObjectiveStore(), lambda: FailureMode.FAIL_CLOSE, lambda: "", lambda: None,
        kv=feeder, max_endpoints=8,
    )  # fmt: skip
    inboxes: list[list[tuple[object, bool]]] = [[], []]
    for worker, inbox in zip(pool._workers, inboxes, strict=True):
        worker.child.send = lambda msg, box=inbox: box.append((msg, False)) is None  # type: ignore[method-assign]
        worker.child.send_with_fd = lambda msg, fd, box=inbox: box.append((msg, fd >= 0)) is None  # type: ignore[method-assign]
    try:
        feeder._new_directory()  # a feeder child about to start: its directory goes to every worker, with its fd
        assert all(inbox[-1] == (KvDirectory(), True) for inbox in inboxes)
        status = FeederStatus(0, [A, B], {A: 1.0}, {}, {})
        feeder._on_message(status)
        assert all(inbox[-1] == (status, False) for inbox in inboxes)
        inboxes[1].clear()
        pool._started(pool._workers[1])  # a worker (re)started: the directory and the last status, in that order
        replayed = [msg for msg, _ in inboxes[1] if isinstance(msg, (KvDirectory, FeederStatus))]
        assert replayed == [KvDirectory(), status]
        feeder._drop_child()  # the feeder ended: every worker forgets its table
        assert all(inbox[-1] == (KvGone(), False) for inbox in inboxes)
    finally:
        feeder._drop_child()
        asyncio.run(pool.stop(0.0))
