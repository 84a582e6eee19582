"""The scrape child is supervised: a killed or hung child is restarted with backoff, its logs reach the parent's log.

Reproduction kept from the hardening probe: SIGKILL of the scrape child left one log line, every endpoint stale
within 2 s, readiness still 200 and the picker routing on frozen data, for ever. The child's own log lines (why an
endpoint was unhealthy) never reached the picker's log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.process import ScrapeProcess
from tests.scrape.fake_server import FakeMetricsServer
from tests.scrape.test_process import servers  # noqa: F401
from tests.scrape.test_scraper import FAST, row, wait_for

pytestmark = pytest.mark.process


def scraped_at(table: EndpointTable, address: str) -> float:
    slot = table.slot_of(address)
    assert slot is not None
    return float(table.snapshot().scraped_at[slot])


async def test_a_killed_child_is_restarted_and_serves_fresh_data(
    servers,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SIGKILL the child: a new PID scrapes again (the probe's child stayed dead), the death is logged with its
    signal, and the endpoint's data moves again. The issue's bound is 5 s; the first restart comes after ~0.2 s."""
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 4\n").start()
    servers.append(a)
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=64)
    with caplog.at_level(logging.INFO):
        await proc.start()
        try:
            await wait_for(lambda: row(table, a.address)["waiting"] == 4.0, 30)
            first = proc.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            a.page = b"vllm:num_requests_waiting 7\n"
            await wait_for(lambda: proc.pid not in (None, first), 30)
            killed_at = scraped_at(table, a.address)
            await wait_for(lambda: row(table, a.address)["waiting"] == 7.0 and row(table, a.address)["healthy"], 30)
            assert scraped_at(table, a.address) > killed_at
            assert proc.restarts == 1 and proc.last_exit == "killed by SIGKILL"
            assert proc.supervision()["pid"] == proc.pid
        finally:
            await proc.stop()
    deaths = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert len(deaths) == 1 and f"scrape process {first} died (killed by SIGKILL)" in deaths[0]


async def test_a_hung_child_is_killed_and_replaced(servers) -> None:  # noqa: F811
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 1\n").start()
    servers.append(a)
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=8, heartbeat_timeout_s=1.5)
    await proc.start()
    try:
        await wait_for(lambda: row(table, a.address)["waiting"] == 1.0, 30)
        first = proc.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)  # alive, but silent
        await wait_for(lambda: proc.pid not in (None, first), 30)
        assert proc.last_exit == "killed by SIGKILL"
        a.page = b"vllm:num_requests_waiting 2\n"
        await wait_for(lambda: row(table, a.address)["waiting"] == 2.0, 30)
    finally:
        await proc.stop()


async def test_restarts_back_off_exponentially_up_to_the_cap(servers) -> None:  # noqa: F811
    table = EndpointTable()
    proc = ScrapeProcess(table, FAST, max_endpoints=8, restart_initial_s=0.05, restart_max_s=0.2)
    await proc.start()
    delays = []
    try:
        for _ in range(4):
            pid = proc.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            await wait_for(lambda: proc.child.restart_at is not None, 30)
            delays.append(proc.child.backoff.delay)
            await wait_for(lambda: proc.pid not in (None, pid), 30)  # noqa: B023
    finally:
        await proc.stop()
    assert delays == [0.1, 0.2, 0.2, 0.2]  # the next delay after each death: doubled, capped
    assert proc.restarts == 4


async def test_child_log_lines_reach_the_parent_log(servers, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    """An endpoint that stops answering: the child's "unusable: refused" line, then "usable again", come out of
    the parent's loggers (its handlers, its format), marked with the child's process."""
    a = await FakeMetricsServer(page=b"vllm:num_requests_waiting 3\n").start()
    servers.append(a)
    table = EndpointTable()
    table.upsert(EndpointInfo(a.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=8)
    with caplog.at_level(logging.INFO):
        await proc.start()
        try:
            await wait_for(lambda: row(table, a.address)["healthy"], 30)
            child = proc.pid
            await a.stop()

            def relayed(text: str) -> list[logging.LogRecord]:
                return [r for r in caplog.records if text in r.getMessage() and r.processName == "epp-scrape"]

            await wait_for(lambda: bool(relayed(f"endpoint {a.address} unusable: refused")), 30)
            record = relayed("unusable")[0]
            assert record.levelno == logging.WARNING and record.process == child
            assert record.name == "epp.scrape.scraper"
            await wait_for(lambda: proc.status()[a.address].unusable == "refused", 30)  # statuses come each second
            assert "connect failed" in (proc.status()[a.address].last_error or "")
            await a.start()
            await wait_for(lambda: bool(relayed(f"endpoint {a.address} usable again")), 30)
            await wait_for(lambda: proc.status()[a.address].unusable is None, 30)
        finally:
            await proc.stop()


async def test_refused_values_and_poll_errors_are_counted_across_restarts(servers) -> None:  # noqa: F811
    bad = await FakeMetricsServer(page=b"vllm:num_requests_waiting -5\n").start()
    servers.append(bad)
    table = EndpointTable()
    table.upsert(EndpointInfo(bad.address))
    proc = ScrapeProcess(table, FAST, max_endpoints=8)
    await proc.start()
    try:
        await wait_for(lambda: proc.rejected_values().get(("waiting", "negative"), 0) > 0, 30)
        before = proc.rejected_values()[("waiting", "negative")]
        pid = proc.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: proc.pid not in (None, pid), 30)
        await asyncio.sleep(0)
        assert proc.rejected_values()[("waiting", "negative")] >= before  # the dead child's count is kept
        await wait_for(lambda: proc.rejected_values()[("waiting", "negative")] > before, 30)
    finally:
        await proc.stop()
