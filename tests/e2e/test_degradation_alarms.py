"""A real `epp serve --workers 2` behind a real Envoy, every prompt unique: the prefix scorer matches nothing and adds
nothing to any pick, and the picker says so in /metrics (`llm_d_epp_degraded`, the max over the workers) and in
/debug/pool within 1,000 requests; the receipts' aggregates are there too."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.director.director import WATCH_EVERY
from tests.e2e.conftest import Picker, start_picker
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, http_ok, running, wait_until

INERT = ("prefix-cache-scorer", "constant_output")


def _families(picker: Picker) -> dict[str, Any]:
    with urllib.request.urlopen(picker.url("/metrics"), timeout=5) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def _degraded(picker: Picker) -> dict[tuple[str, str], float]:
    family = _families(picker).get("llm_d_epp_degraded")
    return {} if family is None else {(s.labels["plugin"], s.labels["reason"]): s.value for s in family.samples}


@pytest.fixture(scope="module")
def unscraped_gateway(envoy_available: None, e2e_tmp: Path) -> Iterator[tuple[Picker, str]]:
    with echo_backends(2, e2e_tmp / "alarm-backends.log") as addresses:  # /metrics: a page without engine metrics
        argv, picker = start_picker(e2e_tmp, ",".join(addresses), "--workers", "2")
        with running(argv, e2e_tmp / "picker-alarms.log") as proc:
            wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve --workers 2", proc)
            with envoy(e2e_tmp, picker.grpc_port, "BUFFERED", streams_per_connection=5, workers=2) as port:
                yield picker, f"http://127.0.0.1:{port}"


async def test_unique_prompts_raise_the_prefix_scorers_constant_output_within_1000_requests(
    unscraped_gateway: tuple[Picker, str],
) -> None:
    picker, gateway = unscraped_gateway
    assert _degraded(picker).get(INERT) == 0.0  # exported before anything happened
    sent = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one(i: int) -> None:
            body = {"model": "m1", "messages": [{"role": "user", "content": f"question {i}"}]}
            async with session.post(gateway + "/v1/chat/completions", json=body) as r:
                await r.read()
                assert r.status == 200

        while sent < 1000 and _degraded(picker).get(INERT) != 1.0:
            await asyncio.gather(*(one(sent + i) for i in range(50)))
            sent += 50
            await asyncio.sleep(0.6)  # a worker's numbers reach the control process every 0.5 s
    assert _degraded(picker)[INERT] == 1.0, f"not raised after {sent} requests: {_degraded(picker)}"
    families = _families(picker)
    episodes = {
        (s.labels["plugin"], s.labels["reason"]): s.value
        for s in families["llm_d_epp_degraded_episodes"].samples
        if s.name.endswith("_total")
    }
    assert episodes[INERT] >= 1
    receipts = sum(s.value for s in families["llm_d_epp_route_receipts"].samples if s.name.endswith("_total"))
    assert sent / WATCH_EVERY - 2 <= receipts <= sent / WATCH_EVERY  # one pick in WATCH_EVERY, in each of 2 workers
    with urllib.request.urlopen(picker.url("/debug/pool"), timeout=5) as r:
        report = json.loads(r.read())
    assert {"plugin": INERT[0], "reason": INERT[1]} in report["degraded"]
