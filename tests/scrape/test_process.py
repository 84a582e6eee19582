"""The scrape service in a child process: rows come back through shared memory into the parent's table."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable

import pytest

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.child import Landed
from epp.scrape.process import ScrapeProcess
from epp.scrape.scraper import ScrapeSettings
from tests.scrape.fake_server import FakeMetricsServer
from tests.scrape.test_scraper import FAST, row, wait_for
from tests.scrape.vllm_page import vllm_page


@pytest.fixture
async def servers() -> AsyncIterator[list[FakeMetricsServer]]:
    started: list[FakeMetricsServer] = []
    yield started
    for s in started:
        await s.stop()


@pytest.mark.process
async def test_child_scrapes_into_the_parent_table_and_follows_membership(servers) -> None:
    a = await FakeMetricsServer(page=vllm_page(waiting=4, running_adapters="x,y").encode()).start()
    b = await FakeMetricsServer(page=b"sglang:num_queue_reqs 9\nsglang:token_usage 0.5\n").start()
    servers += [a, b]
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=64)
    await proc.start()
    child_pid = proc.pid
    assert child_pid is not None
    try:
        await wait_for(lambda: row(table, a.address)["healthy"], 30)
        assert row(table, a.address)["waiting"] == 4.0
        # the block is a memfd (no name in /dev/shm): a picker killed now leaves nothing behind
        with open(f"/proc/{child_pid}/maps") as maps:
            assert "/memfd:epp-scrape-rows" in maps.read()
        await wait_for(lambda: row(table, a.address)["adapters"] == frozenset({"x", "y"}))

        table.upsert(EndpointInfo(b.address, engine="sglang"))
        await wait_for(lambda: row(table, b.address)["healthy"])
        assert (row(table, b.address)["waiting"], row(table, b.address)["kv"]) == (9.0, 0.5)

        table.remove(a.address)
        await wait_for(lambda: proc.status().get(b.address) is not None and a.address not in proc.status())

        await b.stop()
        await wait_for(lambda: not row(table, b.address)["healthy"])
        await b.start()
        await wait_for(lambda: row(table, b.address)["healthy"])
        await wait_for(lambda: proc.status()[b.address].scrapes > 0)
    finally:
        await proc.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)


@pytest.mark.process
async def test_a_reused_slot_never_gets_the_old_endpoints_rows(servers) -> None:
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 1\n").start()
    b = await FakeMetricsServer(page=b"vllm:num_requests_waiting 2\n", mode="hang").start()
    servers += [a, b]
    table = EndpointTable()
    slot = table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, ScrapeSettings(interval_s=0.02, timeout_s=30), max_endpoints=8)
    await proc.start()
    try:
        await wait_for(lambda: row(table, a.address)["waiting"] == 1.0, 30)
        table.remove(a.address)
        assert table.upsert(EndpointInfo(b.address)) == slot  # same slot, another endpoint
        for _ in range(20):  # several apply rounds while b's scrape hangs
            await asyncio.sleep(0.01)
            proc.apply()
        assert row(table, b.address)["failures"] == 0
        assert row(table, b.address)["waiting"] != 1.0
    finally:
        await proc.stop()


async def test_without_shared_memory_it_scrapes_in_process(servers, monkeypatch: pytest.MonkeyPatch) -> None:
    import epp.scrape.process as process

    def no_shm(*args: object, **kwargs: object) -> None:
        raise OSError("no memfd here")

    monkeypatch.setattr(process, "new_memfd", no_shm)
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 6\n").start()
    servers.append(a)
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST)
    await proc.start()
    try:
        await wait_for(lambda: row(table, a.address)["waiting"] == 6.0)
        assert proc.status()[a.address].scrapes > 0
    finally:
        await proc.stop()


@pytest.mark.process
async def test_a_repeated_page_wakes_nobody_yet_the_parent_table_stays_dated(servers) -> None:
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 3\n").start()
    servers.append(a)
    table = EndpointTable()
    slot = table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=8)
    landed: list[Landed] = []

    def handle(msg: object, inner: Callable[[object], None] = proc._handle) -> None:
        if isinstance(msg, Landed):
            landed.append(msg)
        inner(msg)

    proc.child._on_message = handle  # counts the child's announcements on their way in
    await proc.start()
    try:
        await wait_for(lambda: row(table, a.address)["waiting"] == 3.0, 30)
        await wait_for(lambda: proc.status()[a.address].scrapes >= 3)  # the statuses lag: the rows have landed
        count, first = len(landed), table.view().scraped_at[slot]
        await wait_for(lambda: table.view().scraped_at[slot] > first + 5 * FAST.interval_s)
        assert len(landed) == count  # the same page again and again: stamps, no Landed
        assert row(table, a.address)["healthy"]  # fresh: its age is the last scrape's
        a.page = b"vllm:num_requests_waiting 4\n"
        await wait_for(lambda: row(table, a.address)["waiting"] == 4.0)
        assert len(landed) > count
    finally:
        await proc.stop()
