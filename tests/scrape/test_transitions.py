"""One log line when an endpoint turns unusable (with the reason) and one when it recovers, rate-limited."""

from __future__ import annotations

import logging

import pytest

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.scraper import EndpointStatus, ScrapeService, ScrapeSettings, failure_reason
from tests.scrape.test_scraper import serve, servers, service_for, wait_for  # noqa: F401


@pytest.mark.parametrize(
    ("problem", "reason"),
    [
        ("connect failed: Connect call failed ('127.0.0.1', 1)", "refused"),
        ("connection closed before a response", "refused"),
        ("timed out after 1s", "timeout"),
        ("HTTP 500", "http_error"),
        ("page larger than 8388608 bytes", "too_large"),
        ("line 3 (vllm:num_requests_waiting): could not parse", "parse_error"),
        ("internal error: KeyError: 'x'", "internal"),
    ],
)
def test_failures_are_classed_by_reason(problem: str, reason: str) -> None:
    assert failure_reason(problem) == reason


def test_a_flapping_endpoint_logs_each_direction_at_most_once_per_10s_and_ends_on_its_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    svc = ScrapeService(EndpointTable(), clock=lambda: now[0])
    st = EndpointStatus("127.10.0.7:8000", "vllm")
    svc._status[st.address] = st
    with caplog.at_level(logging.INFO, logger="epp.scrape.scraper"):
        for _ in range(5):  # down, up, down, up … within a second
            svc._turn_unusable(st, "refused", "3 failed scrapes in a row", now[0])
            now[0] += 0.1
            svc._turn_usable(st, now[0])
            now[0] += 0.1
        svc._turn_unusable(st, "timeout", "3 failed scrapes in a row", now[0])  # it stays down
        svc._log_pending(now[0])
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and "unusable: refused" in lines[0] and "usable again" in lines[1]
        now[0] += 10.0
        svc._log_pending(now[0])  # the held-back change shows up, so the log ends on the state it is in
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "unusable: timeout" in lines[2] and "held back" in lines[2]


async def test_an_endpoint_that_starts_hanging_turns_unusable_as_stale(servers, service_for, caplog) -> None:  # noqa: F811
    server = await serve(servers, b"vllm:num_requests_waiting 1\n")
    table = EndpointTable()
    table.upsert(EndpointInfo(server.address))
    svc: ScrapeService = service_for(table, ScrapeSettings(interval_s=0.02, timeout_s=30, staleness_s=0.3))
    with caplog.at_level(logging.WARNING, logger="epp.scrape.scraper"):
        await svc.start()
        await wait_for(lambda: svc.status()[server.address].last_ok_at is not None)
        server.mode = "hang"  # answers no more, and a 30 s timeout is far off: only the data's age tells
        await wait_for(lambda: svc.status()[server.address].unusable == "stale")
    assert any(f"{server.address} unusable: stale (no page for" in r.getMessage() for r in caplog.records)
