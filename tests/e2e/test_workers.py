"""`epp serve --workers 2` through a real Envoy: both workers serve, a burst spreads as with one process, and a
SIGKILLed worker is replaced without failing requests it did not hold."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Picker, start_picker
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, http_ok, running, wait_until

CHAT = "/v1/chat/completions"
ENDPOINTS = 4


@pytest.fixture(scope="module")
def four_backends(e2e_tmp: Path) -> Iterator[list[str]]:
    with echo_backends(ENDPOINTS, e2e_tmp / "workers-backends.log") as addresses:
        yield addresses


def worker_streams(picker: Picker) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(picker.url("/metrics"), timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "epp_worker_streams":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["worker"]] = sample.value
    return out


def metric_sum(picker: Picker, sample: str) -> float:
    """The sum of every sample named `sample` in the picker's /metrics (all label sets)."""
    import urllib.request

    with urllib.request.urlopen(picker.url("/metrics"), timeout=5) as r:
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == sample)


def debug_pool(picker: Picker) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(picker.url("/debug/pool"), timeout=5) as r:
        report: dict[str, Any] = json.loads(r.read())
    return report


def debug_workers(picker: Picker) -> list[dict[str, Any]]:
    workers: list[dict[str, Any]] = debug_pool(picker)["workers"]
    return workers


def all_scraped(picker: Picker) -> bool:
    """Every endpoint has had its first page: none is preferred for being the only one known."""
    return all(e["metricsAgeSeconds"] is not None for e in debug_pool(picker)["endpoints"])


async def burst(gateway: str, n: int, concurrency: int) -> tuple[Counter[str], list[int]]:
    served: Counter[str] = Counter()
    failed: list[int] = []
    semaphore = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": "m1", "messages": [{"role": "user", "content": f"request {i}: " + "lorem ipsum " * 30}]}
        async with semaphore, session.post(gateway + CHAT, json=body) as r:
            data = await r.read()
            if r.status != 200:
                failed.append(r.status)
                return
        served[json.loads(data)["served_by"]] += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(one(session, i) for i in range(n)))
    return served, failed


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def workers_gateway(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, four_backends: list[str]
) -> Iterator[tuple[int, Picker, str]]:
    workers = int(request.param)
    # Scrapes far apart (the echo backends have no /metrics anyway): only the pickers' own bookings move the
    # choice, which is what a burst between two scrapes is.
    argv, picker = start_picker(
        e2e_tmp,
        ",".join(four_backends),
        "--workers",
        str(workers),
        "--refresh-metrics-interval",
        "10s",
        "--metrics-staleness-threshold",
        "60s",
    )
    with running(argv, e2e_tmp / f"picker-workers-{workers}.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve --workers", proc)
        if workers > 1:  # ready as soon as one serves; the split is measured with every worker up
            wait_until(lambda: all(w["serving"] for w in debug_workers(picker)), 60, "every worker", proc)
        wait_until(lambda: all_scraped(picker), 60, "every endpoint's first scrape", proc)
        # Two Envoy worker threads, a new connection to the picker every 5 streams: the kernel spreads connections.
        with envoy(e2e_tmp, picker.grpc_port, "BUFFERED", streams_per_connection=5, workers=2) as port:
            yield workers, picker, f"http://127.0.0.1:{port}"


async def test_a_burst_spreads_over_the_pool_and_every_worker_serves(workers_gateway: tuple[int, Picker, str]) -> None:
    workers, picker, gateway = workers_gateway
    served, failed = await burst(gateway, 100, 20)
    assert failed == []
    assert sum(served.values()) == 100
    assert len(served) == ENDPOINTS
    # The one-process bound of tests/scheduling (≤ 20 of 100 on 8 endpoints), scaled to 4: no endpoint herded.
    assert max(served.values()) <= 40, served
    if workers > 1:
        streams = worker_streams(picker)
        assert set(streams) == {"0", "1"}
        assert all(count > 0 for count in streams.values()), streams


async def test_a_killed_worker_is_replaced_and_the_others_keep_serving(
    workers_gateway: tuple[int, Picker, str],
) -> None:
    workers, picker, gateway = workers_gateway
    if workers == 1:
        pytest.skip("one process: there is no worker to kill")
    before = debug_workers(picker)
    victim = before[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    # Requests while it is down: Envoy's streams on the killed connection fail (those it held); new ones land on
    # the surviving worker.
    _, failed = await burst(gateway, 50, 5)
    wait_until(lambda: debug_workers(picker)[0]["pid"] not in (None, victim), 60, "the worker's replacement")
    wait_until(lambda: debug_workers(picker)[0]["serving"], 60, "the replacement serving")
    after = debug_workers(picker)
    assert after[0]["restarts"] == 1
    assert "SIGKILL" in (after[0]["last_exit"] or "")
    assert len(failed) <= 5, failed  # at most the streams in flight on the killed worker (concurrency 5)
    served2, failed2 = await burst(gateway, 50, 5)
    assert failed2 == []
    assert sum(served2.values()) == 50


async def test_repeats_of_a_prompt_land_where_the_first_went_whichever_worker_takes_them(
    workers_gateway: tuple[int, Picker, str],
) -> None:
    """The prefix index across workers: each worker's prefix scorer learns the others' picks from the shared log,
    so a repeat taken by the other worker still goes where the first request of its prefix went."""
    workers, picker, gateway = workers_gateway
    prefixes = [f"customer {k} context: " + f"the history of customer {k}, told at length. " * 40 for k in range(12)]

    async def send(session: aiohttp.ClientSession, content: str) -> str:
        body = {"model": "m1", "messages": [{"role": "user", "content": content}]}
        async with session.post(gateway + CHAT, json=body) as r:
            assert r.status == 200, await r.text()
            served: str = json.loads(await r.read())["served_by"]
            return served

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        first = [await send(session, p + " first question?") for p in prefixes]
        await asyncio.sleep(0.2)  # the log is read every 10 ms
        repeats = [(k, await send(session, p + f" question {j}?")) for j in range(4) for k, p in enumerate(prefixes)]
    together = sum(served == first[k] for k, served in repeats)
    assert together >= 0.9 * len(repeats), (together, len(repeats))
    if workers > 1:
        learned = [w["picks_learned"] for w in debug_workers(picker)]
        assert all(n > 0 for n in learned), learned  # both workers took picks, and each learned the other's
        # the workers' prefix indexes in /metrics (the control process's scheduler never picks): every lookup of
        # the 60 requests counted once, in the worker that made it, and the blocks they hold
        deadline = time.monotonic() + 10  # expositions reach the control process every 0.5 s
        while metric_sum(picker, "llm_d_epp_prefix_indexer_hit_ratio_count") < len(first) + len(repeats):
            assert time.monotonic() < deadline, metric_sum(picker, "llm_d_epp_prefix_indexer_hit_ratio_count")
            await asyncio.sleep(0.2)
        assert metric_sum(picker, "llm_d_epp_prefix_indexer_size") > 0
