"""The scrape service against real HTTP servers on loopback.

No timed assertions: tests wait for a condition (bounded by a generous deadline that only guards against a hang)
and then check what state the table and statuses are in.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable

import pytest

from epp.datastore import usable_slots
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.scraper import ScrapeService, ScrapeSettings
from tests.scrape.fake_server import FakeMetricsServer
from tests.scrape.vllm_page import vllm_page

FAST = ScrapeSettings(interval_s=0.02, timeout_s=0.5, staleness_s=0.3, max_failures=3, backoff_max_s=0.1)


async def wait_for(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait until cond() holds; the limit only stops a broken test from hanging."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


@pytest.fixture
async def servers() -> AsyncIterator[list[FakeMetricsServer]]:
    started: list[FakeMetricsServer] = []
    yield started
    for s in started:
        await s.stop()


async def serve(servers: list[FakeMetricsServer], page: bytes, mode: str = "ok") -> FakeMetricsServer:
    server = await FakeMetricsServer(page=page, mode=mode).start()
    servers.append(server)
    return server


@pytest.fixture
async def service_for() -> AsyncIterator[Callable[..., ScrapeService]]:
    services: list[ScrapeService] = []

    def make(table: EndpointTable, settings: ScrapeSettings = FAST) -> ScrapeService:
        svc = ScrapeService(table, settings, seed=1)
        services.append(svc)
        return svc

    yield make
    for svc in services:
        await svc.stop()


def row(table: EndpointTable, address: str) -> dict[str, object]:
    slot = table.slot_of(address)
    assert slot is not None
    snap = table.snapshot()
    return {
        "waiting": snap.waiting[slot],
        "running": snap.running[slot],
        "kv": snap.kv_usage[slot],
        "healthy": bool(usable_slots(snap, time.monotonic(), FAST.freshness)[slot]),  # decisions use its data
        "failures": int(snap.scrape_failures[slot]),
        "adapters": snap.running_adapters[slot],
    }


@pytest.mark.parametrize("mode", ["ok", "chunked", "close", "http10"])
async def test_writes_the_page_signals_into_the_table(servers, service_for, mode: str) -> None:
    server = await serve(servers, vllm_page(waiting=5, running=2, kv_usage=0.25).encode(), mode)
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: svc.status()[server.address].scrapes >= 3)
    r = row(table, server.address)
    assert (r["waiting"], r["running"], r["kv"], r["healthy"]) == (5.0, 2.0, 0.25, True)
    assert r["adapters"] == frozenset({"sql-lora", "chat-lora"})
    assert svc.status()[server.address].last_error is None


async def test_keeps_one_connection_alive(servers, service_for) -> None:
    server = await serve(servers, vllm_page().encode())
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: server.requests >= 5)
    assert len(server._writers) == 1


async def test_a_kept_alive_connection_closed_by_the_server_is_retried_not_failed(servers, service_for) -> None:
    server = await serve(servers, vllm_page().encode(), "idle_close")
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: svc.status()[server.address].scrapes >= 5)
    assert svc.status()[server.address].failures == 0


async def test_dead_endpoint_goes_stale_and_comes_back_healthy(servers, service_for) -> None:
    server = await serve(servers, vllm_page().encode())
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: row(table, server.address)["healthy"])

    await server.stop()
    await wait_for(lambda: not row(table, server.address)["healthy"])
    snap = table.snapshot()
    now = asyncio.get_running_loop().time()
    # not usable because failing or old: either way decisions read its data as unknown
    assert not usable_slots(snap, now, FAST.freshness)[table.slot_of(server.address)]
    assert svc.status()[server.address].last_error

    await server.start()  # same port
    await wait_for(lambda: row(table, server.address)["healthy"])
    assert row(table, server.address)["failures"] == 0


async def test_a_hanging_server_does_not_delay_the_others(servers, service_for) -> None:
    hung = await serve(servers, b"", "hang")
    good = [await serve(servers, vllm_page(waiting=i).encode()) for i in range(3)]
    table = EndpointTable()
    for s in [hung, *good]:
        table.upsert(EndpointInfo(s.address))
    svc = service_for(table, ScrapeSettings(interval_s=0.02, timeout_s=30.0, staleness_s=60.0))
    await svc.start()
    await wait_for(lambda: all(svc.status()[g.address].scrapes >= 10 for g in good))
    # the hung scrape is still waiting for its first answer, while the others went round ten times
    assert hung.requests == 1
    assert svc.status()[hung.address].last_ok_at is None
    assert [row(table, g.address)["waiting"] for g in good] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("page", "mode", "recorded", "error"),
    [
        (bytes(range(256)) * 400, "ok", False, "not valid UTF-8"),
        (b'vllm:num_requests_waiting{a="b" 3\nvllm:num_requests_running 4\n', "ok", True, "line 1"),
        (b"vllm:num_requests_waiting 1\nvllm:num_requests_waiting 2\n", "ok", True, "duplicate series"),
        (b"x", "status500", False, "HTTP 500"),
        (b"vllm:num_requests_waiting 1\n" * (1 << 21), "ok", False, "larger than"),
        (b"vllm:num_requests_waiting 1\n" * (1 << 21), "chunked", False, "larger than"),
    ],
    ids=["binary-garbage", "truncated-line", "duplicate-series", "http-500", "50MB-page", "50MB-chunked"],
)
async def test_bad_pages_give_an_error_state_not_an_exception(
    servers, service_for, page: bytes, mode: str, recorded: bool, error: str
) -> None:
    server = await serve(servers, page, mode)
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    settings = ScrapeSettings(interval_s=0.02, timeout_s=2.0, max_page_bytes=1 << 20, backoff_max_s=0.05)
    svc = service_for(table, settings)
    await svc.start()
    await wait_for(lambda: svc.status()[server.address].scrapes >= 2)
    st = svc.status()[server.address]
    assert error in (st.last_error or "")
    assert (st.last_ok_at is not None) == recorded
    assert (row(table, server.address)["failures"] == 0) == recorded


async def test_escaped_label_values_are_read(servers, service_for) -> None:
    page = b'vllm:num_requests_waiting{model_name="a\\"b\\nc"} 7\nvllm:kv_cache_usage_perc NaN\n'
    server = await serve(servers, page)
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: svc.status()[server.address].scrapes >= 1 and row(table, server.address)["healthy"])
    r = row(table, server.address)
    assert r["waiting"] == 7.0
    assert math.isnan(r["running"])  # not on the page: unknown, never zero
    assert math.isnan(r["kv"])


async def test_follows_membership_changes(servers, service_for) -> None:
    a = await serve(servers, vllm_page(waiting=1).encode())
    b = await serve(servers, b"sglang:num_queue_reqs 9\nsglang:token_usage 0.5\n")
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    svc = service_for(table)
    await svc.start()
    await wait_for(lambda: row(table, a.address)["healthy"])

    table.upsert(EndpointInfo(b.address, engine="sglang"))
    await wait_for(lambda: row(table, b.address)["healthy"])
    assert (row(table, b.address)["waiting"], row(table, b.address)["kv"]) == (9.0, 0.5)

    table.remove(a.address)
    await wait_for(lambda: a.address not in svc.status())
    before, b_seen = a.requests, svc.status()[b.address].scrapes
    await wait_for(lambda: svc.status()[b.address].scrapes >= b_seen + 5)
    assert a.requests <= before + 1  # at most the scrape that was in flight


class _PageClient:
    """A metrics client that serves whatever `page` holds now, counting its gets."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.gets = 0

    async def get(self, timeout_s: float, max_bytes: int) -> bytes:
        self.gets += 1
        return self.page

    def close(self) -> None:
        pass


async def test_a_repeated_page_is_not_parsed_again_but_still_dates_the_row(monkeypatch) -> None:
    import epp.scrape.scraper as scraper

    parsed: list[str] = []
    real_extract = scraper.extract
    monkeypatch.setattr(scraper, "extract", lambda text, engine: parsed.append(text) or real_extract(text, engine))
    client = _PageClient(vllm_page(waiting=3).encode())
    table = EndpointTable()
    slot = table.upsert(EndpointInfo("127.0.0.1:9"))
    svc = ScrapeService(table, FAST, seed=1, client_factory=lambda info: client)
    await svc.start()
    try:
        await wait_for(lambda: client.gets >= 2)
        first_at = table.snapshot().scraped_at[slot]
        await wait_for(lambda: client.gets >= 5)
        assert len(parsed) == 1  # the same bytes: parsed once
        assert table.snapshot().scraped_at[slot] > first_at  # each scrape still dates the row
        assert svc.status()["127.0.0.1:9"].scrapes >= 5
        client.page = vllm_page(waiting=7).encode()
        await wait_for(lambda: table.snapshot().waiting[slot] == 7.0)
        assert len(parsed) == 2
    finally:
        await svc.stop()


async def test_a_kept_alive_connection_that_stops_answering_times_out_and_recovers(servers, service_for) -> None:
    server = await serve(servers, vllm_page(waiting=2).encode())
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc = service_for(table, ScrapeSettings(interval_s=0.02, timeout_s=0.2, staleness_s=60.0, backoff_max_s=0.05))
    await svc.start()
    await wait_for(lambda: svc.status()[server.address].scrapes >= 3)
    server.mode = "hang"  # the kept-alive connection's next request gets no answer
    await wait_for(lambda: svc.status()[server.address].failures >= 1)
    assert svc.status()[server.address].last_error == "timed out after 0.2s"
    assert svc.poll_errors.get("timeout", 0) >= 1
    server.mode = "ok"
    failures = svc.status()[server.address].failures
    await wait_for(lambda: svc.status()[server.address].streak == 0)  # a new connection answers again
    assert svc.status()[server.address].failures <= failures + 1
    assert row(table, server.address)["waiting"] == 2.0


class _SlowClient:
    """Answers after a few loop turns, counting how many gets are under way at once (all its instances)."""

    now = 0
    most = 0

    async def get(self, timeout_s: float, max_bytes: int) -> bytes:
        _SlowClient.now += 1
        _SlowClient.most = max(_SlowClient.most, _SlowClient.now)
        try:
            await asyncio.sleep(0.005)
        finally:
            _SlowClient.now -= 1
        return vllm_page().encode()

    def close(self) -> None:
        pass


async def test_the_concurrency_bound_holds_across_endpoints() -> None:
    table = EndpointTable()
    for i in range(6):
        table.upsert(EndpointInfo(f"127.0.0.1:{9000 + i}"))
    settings = ScrapeSettings(interval_s=0.02, concurrency=2)
    svc = ScrapeService(table, settings, seed=1, client_factory=lambda info: _SlowClient())
    await svc.start()
    try:
        await wait_for(lambda: all(s.scrapes >= 3 for s in svc.status().values()))
        assert _SlowClient.most == 2  # never more than the bound, and the bound was reached
    finally:
        await svc.stop()
    assert _SlowClient.now == 0
