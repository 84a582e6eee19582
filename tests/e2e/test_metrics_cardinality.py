"""Hostile model names through a real Envoy to `epp serve --workers 2`: the label caps hold for the picker as a
whole, so `/metrics` and the memory behind it stay bounded.

Measured: `/metrics` bytes after the load; the RSS of every process of the picker (control, workers, scrape
child) before and after it. What an idle picker costs in CPU is a benchmark's figure (benchmarks/idle_children.py,
in benchmarks/RESULTS.md), not a bound here: a share of a core over seconds on a shared machine is a timing, and
this box's run-to-run spread for one process (1.4-2.8 % of a core, same commit) is wider than the margin."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from epp.observability.labels import MODEL_LIMIT
from tests.e2e.conftest import Picker, start_picker
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, http_ok, http_text, running, wait_until

CHAT = "/v1/chat/completions"
REQUESTS = 3000  # each with a model name of its own
NAME_BYTES = 200
TIME_LIMIT_S = 240  # the load's bound in seconds, whatever the machine


def picker_pids(root: int) -> list[int]:
    """The picker's control process and every process below it (workers, the scrape child)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    return pids


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def distinct_name(i: int) -> str:
    head = f"client-model-{i}-"
    return head + "x" * (NAME_BYTES - len(head))


async def load(gateway: str) -> list[int]:
    """`REQUESTS` requests, 16 at a time, each naming its own model; the statuses of the answers."""
    statuses: list[int] = []
    semaphore = asyncio.Semaphore(16)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": distinct_name(i), "messages": [{"role": "user", "content": f"request {i}"}]}
        async with semaphore, session.post(gateway + CHAT, json=body) as r:
            await r.read()
            statuses.append(r.status)

    timeout = aiohttp.ClientTimeout(total=TIME_LIMIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.wait_for(asyncio.gather(*(one(session, i) for i in range(REQUESTS))), TIME_LIMIT_S)
    return statuses


@pytest.fixture(scope="module")
def two_workers(envoy_available: None, e2e_tmp: Path) -> Iterator[tuple[int, Picker, str]]:
    with echo_backends(2, e2e_tmp / "cardinality-backends.log") as addresses:
        # Scrapes once a second: the idle window measures what the picker costs on its own (a scrape of answering
        # backends every 50 ms, the default, is work asked for; benchmarks/idle_children.py measures the default).
        argv, picker = start_picker(e2e_tmp, ",".join(addresses), "--workers", "2", "--refresh-metrics-interval", "1s")
        with running(argv, e2e_tmp / "picker-cardinality.log") as proc:
            wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve --workers 2", proc)
            wait_until(lambda: 'epp_worker_up{worker="1"} 1.0' in http_text(picker.url("/metrics")), 60, "both")
            with envoy(e2e_tmp, picker.grpc_port, "BUFFERED", workers=2) as port:
                yield proc.pid, picker, f"http://127.0.0.1:{port}"


async def test_distinct_model_names_leave_metrics_and_memory_bounded(
    two_workers: tuple[int, Picker, str],
) -> None:
    root, picker, gateway = two_workers
    pids = picker_pids(root)
    assert len(pids) >= 3  # the control process and two workers (and the scrape child)
    rss_before = rss_bytes(pids)

    statuses = await load(gateway)
    assert len(statuses) == REQUESTS
    assert set(statuses) == {200}

    text = ""
    deadline = time.monotonic() + 10  # the workers' last numbers reach the control process within METRICS_S
    while time.monotonic() < deadline:
        text = http_text(picker.url("/metrics"))
        counted = sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith('epp_requests_total{code="OK",outcome="routed"}')
        )
        if counted >= REQUESTS:
            break
        await asyncio.sleep(0.2)
    assert counted == REQUESTS
    assert len(text.encode()) < 1_000_000, len(text.encode())
    names = {
        line.partition('model_name="')[2].partition('"')[0]
        for line in text.splitlines()
        if line.startswith("llm_d_epp_request_total{")
    }
    assert len(names) <= MODEL_LIMIT + 1, len(names)  # the picker's cap, and `other`
    assert "other" in names

    rss_growth = rss_bytes(picker_pids(root)) - rss_before
    assert rss_growth <= 40 * 2**20

    print(f"/metrics {len(text.encode())} bytes, {len(names)} model names; RSS +{rss_growth / 2**20:.1f} MiB")
