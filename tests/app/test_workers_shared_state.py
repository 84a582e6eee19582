"""The state serving workers share: each worker writes its own in-flight row, every decision sees the sum; the
control process's rows reach a worker's table; the workers' metrics are summed."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.app.mirror_table import MATRIX_COLUMNS, MirrorTable
from epp.app.settings import ServeSettings
from epp.app.workers import WorkerPool, merge_expositions
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.datastore.rows import NCOL, TOKEN, write_rows
from epp.datastore.table import EndpointInfo, EndpointTable


def members(n: int) -> list[tuple[int, float, EndpointInfo, list[str], list[str]]]:
    return [(slot, float(slot), EndpointInfo(f"127.0.0.1:{8000 + slot}"), [], []) for slot in range(n)]


def shared(workers: int = 2, rows: int = 8) -> tuple[np.ndarray, np.ndarray]:
    block = np.zeros((rows, NCOL))
    block[:, TOKEN] = -1.0
    return block, np.zeros((workers, rows, MATRIX_COLUMNS), dtype=np.int64)


def test_each_worker_sees_every_workers_picks_in_flight() -> None:
    block, matrix = shared()
    a, b = MirrorTable(block, matrix, 0), MirrorTable(block, matrix, 1)
    for table in (a, b):
        table.mirror(members(3))
    a.book_pick(a.slot_of("127.0.0.1:8001") or 0)
    b.book_pick(b.slot_of("127.0.0.1:8001") or 0)
    b.book_pick(b.slot_of("127.0.0.1:8002") or 0)
    a.refresh()
    inflight = {address: int(a.column("inflight")[a.slot_of(address) or 0]) for address in a.addresses()}
    assert inflight == {"127.0.0.1:8000": 0, "127.0.0.1:8001": 2, "127.0.0.1:8002": 1}
    b.release_pick(b.slot_of("127.0.0.1:8001") or 0)
    a.refresh()
    assert int(a.column("inflight")[a.slot_of("127.0.0.1:8001") or 0]) == 1
    assert matrix[1].sum(axis=0).tolist() == [1, 2, 0]  # b's own row: one in flight, two picks since the scrape


def test_a_decisions_read_refreshes_the_table_first_so_no_timer_has_to() -> None:
    """A worker's decision reads the table through `view`, which calls `on_read` first: the worker refreshes there
    (when its last refresh is old enough), so another worker's booking is seen at the next decision with no
    periodic refresh."""
    block, matrix = shared()
    a, b = MirrorTable(block, matrix, 0), MirrorTable(block, matrix, 1)
    for table in (a, b):
        table.mirror(members(2))
    reads: list[int] = []

    def on_read() -> None:
        reads.append(a.refresh())

    a.on_read = on_read
    b.book_pick(b.slot_of("127.0.0.1:8001") or 0)
    view = a.view()
    assert int(view.inflight[a.slot_of("127.0.0.1:8001") or 0]) == 1 and len(reads) == 1
    b.release_pick(b.slot_of("127.0.0.1:8001") or 0)
    assert int(a.view().inflight[a.slot_of("127.0.0.1:8001") or 0]) == 0 and len(reads) == 2


def test_a_dead_workers_cleared_row_stops_counting() -> None:
    block, matrix = shared()
    a, b = MirrorTable(block, matrix, 0), MirrorTable(block, matrix, 1)
    for table in (a, b):
        table.mirror(members(2))
    for _ in range(5):
        b.book_pick(0)
    a.refresh()
    assert int(a.column("inflight")[0]) == 5
    matrix[1] = 0  # what the control process does when worker 1 dies
    a.refresh()
    assert int(a.column("inflight")[0]) == 0


def test_published_rows_reach_the_worker_and_a_fresh_page_resets_its_picks() -> None:
    block, matrix = shared(workers=1)
    table = MirrorTable(block, matrix, 0)
    table.mirror(members(2))
    table.book_pick(table.slot_of("127.0.0.1:8001") or 0)
    values = np.array([[3.0, 1.0, 0.5, 4.0, 16.0, 100.0, 10.0]])
    write_rows(block, np.array([1]), np.array([1.0]), values, np.array([1.0]), np.array([0.0]))
    assert table.refresh() == 1
    slot = table.slot_of("127.0.0.1:8001") or 0
    assert table.column("waiting")[slot] == 3.0
    assert table.column("kv_usage")[slot] == 0.5
    assert int(table.column("picks_since_scrape")[slot]) == 0  # the page shows that pick already
    assert int(table.column("inflight")[slot]) == 1  # still in flight until its response ends
    assert table.refresh() == 0  # nothing new


def test_rows_of_a_replaced_endpoint_are_ignored() -> None:
    block, matrix = shared(workers=1)
    table = MirrorTable(block, matrix, 0)
    table.mirror(members(1))
    values = np.array([[3.0, 1.0, 0.5, 4.0, 16.0, 100.0, 10.0]])
    write_rows(block, np.array([0]), np.array([7.0]), values, np.array([1.0]), np.array([0.0]))  # another token
    assert table.refresh() == 0
    assert np.isnan(table.column("waiting")[0])


def test_worker_expositions_are_summed_by_labels() -> None:
    one = b'# HELP x_total Things.\n# TYPE x_total counter\nx_total{model="a"} 2.0\nx_total{model="b"} 1.0\n'
    two = b'# HELP x_total Things.\n# TYPE x_total counter\nx_total{model="a"} 3.0\n'
    (family,) = merge_expositions([one, two])
    summed = {s.labels["model"]: s.value for s in family.samples}
    assert summed == {"a": 5.0, "b": 1.0}


def test_the_control_process_shows_the_workers_bookings_summed() -> None:
    """/debug/pool and llm_d_epp_inflight_requests read the control process's table: with workers its in-flight
    counts are the matrix's column sums, published with the rows (they stayed 0 before)."""
    table = EndpointTable()
    table.replace_all([EndpointInfo("127.0.0.1:8000"), EndpointInfo("127.0.0.1:8001")])
    pool = WorkerPool(
        2, ServeSettings(), table, ObjectiveStore(), lambda: FailureMode.FAIL_CLOSE, lambda: "", lambda: None,
        max_endpoints=8,
    )  # fmt: skip
    try:
        slot = table.slot_of("127.0.0.1:8001") or 0
        pool.inflight[0, slot] = (2, 3, 40)
        pool.inflight[1, slot] = (1, 1, 10)
        pool._publish()
        assert int(table.column("inflight")[slot]) == 3
        assert int(table.column("picks_since_scrape")[slot]) == 4
        assert int(table.column("inflight_tokens")[slot]) == 50
        pool.inflight[:, slot] = 0  # every response ended (or the workers' rows were cleared)
        pool._publish()
        assert int(table.column("inflight")[slot]) == 0
    finally:
        asyncio.run(pool.stop(0.0))  # no worker was started: closes the shared memory


@settings(max_examples=60, deadline=None)
@given(
    workers=st.integers(1, 4),
    slots=st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.booleans(), st.integers(0, 50)), max_size=40),
)
def test_a_small_pools_bookings_summed_on_python_ints_equal_numpys_sum(
    workers: int, slots: list[int], steps: list[tuple[int, int, bool, int]]
) -> None:
    """`MirrorTable._sum_cells` (a small pool's refresh), in Python and compiled, is `set_bookings(ours,
    matrix[:, theirs].sum(axis=0))`: the same three columns after any bookings and releases by any workers, control
    slots out of order."""
    block, matrix = shared(workers)
    spec = [(slot, float(slot), EndpointInfo(f"127.0.0.1:{8000 + slot}"), [], []) for slot in slots]
    tables = [MirrorTable(block, matrix, me) for me in range(workers)]
    for table in tables:
        table.mirror(spec)
    reference = MirrorTable(block, matrix.copy(), 0)  # the numpy path, on a copy of the same cells
    reference.mirror(spec)
    python = MirrorTable(block, matrix, 0, native=None)  # `_sum_cells` itself, where the compiled sums run above
    python.mirror(spec)
    assert tables[0]._small is not None and python._small is not None
    reference._small = None
    for worker, pick, release, tokens in steps:
        table = tables[worker % workers]
        slot = table.slot_of(f"127.0.0.1:{8000 + slots[pick % len(slots)]}")
        assert slot is not None
        if release:
            table.release_pick(slot, tokens)
        else:
            table.book_pick(slot, tokens)
        reference._matrix[...] = matrix
        tables[0].refresh()
        reference.refresh()
        python.refresh()
        for name in ("inflight", "picks_since_scrape", "inflight_tokens"):
            assert tables[0].column(name).tolist() == reference.column(name).tolist(), name
            assert python.column(name).tolist() == reference.column(name).tolist(), name


@settings(max_examples=80, deadline=None)
@given(
    me=st.integers(0, 2),
    control=st.lists(st.integers(-1, 7), max_size=8),
    steps=st.lists(st.tuples(st.integers(-2, 10), st.booleans(), st.integers(0, 2**40)), max_size=40),
)
def test_a_bookings_compiled_cells_equal_the_python_definition(
    me: int, control: list[int], steps: list[tuple[int, bool, int]]
) -> None:
    """`book_cells` and `release_cells` (epp/app/_pick_log.c) write our row of the in-flight matrix as
    `book_cells_python` and `release_cells_python` do: any slot (none, out of the map, negative), any tokens,
    releases below zero held at zero; the other workers' rows untouched."""
    from epp.app.mirror_table import book_cells_python, release_cells_python
    from epp.app.pick_log import NATIVE

    assert NATIVE is not None  # the extension is built for the tests
    rows = 8
    compiled, python = (np.zeros((3, rows, MATRIX_COLUMNS), dtype=np.int64) for _ in range(2))
    base = me * rows * MATRIX_COLUMNS
    for slot, release, tokens in steps:
        for matrix, book, free in (
            (compiled, NATIVE.book_cells, NATIVE.release_cells),
            (python, book_cells_python, release_cells_python),
        ):
            (free if release else book)(matrix.data.cast("B").cast("q"), base, control, slot, tokens)
        assert compiled.tolist() == python.tolist()
    others = [w for w in range(3) if w != me]
    assert not compiled[others].any()


def test_a_pick_is_shared_under_the_control_slot_and_token_of_its_endpoint() -> None:
    """A worker's `on_pick` names its endpoint as every worker's table does (the control process's slot and the
    token it holds there), from the names made with the membership: a new token after the membership changes, and
    nothing for an endpoint that left."""
    from epp.app.pick_log import PickLog, ring_words
    from epp.app.worker import _sharing

    block, matrix = shared()
    ring = np.zeros(ring_words(2), dtype=np.int64)
    a = MirrorTable(block, matrix, 0)
    a.mirror([(slot + 3, float(40 + slot), EndpointInfo(f"127.0.0.1:{8000 + slot}"), [], []) for slot in range(2)])
    share, reader = _sharing(PickLog(ring, 2, 0), a, 0), PickLog(ring, 2, 1)
    second = a.slot_of("127.0.0.1:8001")
    assert second is not None
    share(second, [7, 8])
    share(99, [9])  # no such slot: nothing written
    assert [(control, token, list(hashes)) for _, control, token, hashes in reader.read()] == [(4, 41, [7, 8])]
    a.mirror([(4, 57.0, EndpointInfo("127.0.0.1:8001"), [], [])])  # the other endpoint left; a new token here
    gone = a.slot_of("127.0.0.1:8000")
    share(a.slot_of("127.0.0.1:8001") or 0, [1])
    if gone is not None:
        share(gone, [2])
    assert [(control, token) for _, control, token, _ in reader.read()] == [(4, 57)]
