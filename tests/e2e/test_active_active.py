"""Two picker replicas behind one Envoy (one ext_proc cluster, two hosts), sharing nothing: requests sharing a
prefix land on the same endpoint whichever replica picks (rendezvous-picker), and a burst does not herd."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from epp.gateway.testbed import gateway_bootstrap
from tests.e2e.conftest import Picker, start_picker
from tests.e2e.test_workers import all_scraped
from tests.support.envoy import run_envoy
from tests.support.procs import ROOT, echo_backends, free_port, http_ok, running, wait_until

CHAT = "/v1/chat/completions"
CONFIG = ROOT / "manifests" / "active-active" / "configmap.yaml"
ENDPOINTS = 4


def requests_served(picker: Picker) -> float:
    with urllib.request.urlopen(picker.url("/metrics"), timeout=5) as r:
        text = r.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "epp_worker_streams" or family.name == "inference_objective_request"
        for s in family.samples
        if s.name.endswith("_total")
    )


@pytest.fixture(scope="module")
def two_replicas(envoy_available: None, e2e_tmp: Path) -> Iterator[tuple[list[Picker], str]]:
    with echo_backends(ENDPOINTS, e2e_tmp / "aa-backends.log") as addresses:
        config_file = e2e_tmp / "active-active.yaml"  # the overlay's ConfigMap, as the pod mounts it
        config_file.write_text(yaml.safe_load(CONFIG.read_text())["data"]["active-active.yaml"])
        flags = (
            "--config-file",
            str(config_file),
            "--refresh-metrics-interval",
            "10s",
            "--metrics-staleness-threshold",
            "60s",
        )
        (argv_a, a), (argv_b, b) = (start_picker(e2e_tmp, ",".join(addresses), *flags) for _ in range(2))
        with running(argv_a, e2e_tmp / "aa-picker-a.log") as pa, running(argv_b, e2e_tmp / "aa-picker-b.log") as pb:
            for picker, p in ((a, pa), (b, pb)):
                wait_until(lambda picker=picker: http_ok(picker.url("/readyz")), 60, "epp serve", p)
                wait_until(lambda picker=picker: all_scraped(picker), 60, "every endpoint's first scrape", p)
            listen, admin = free_port(), free_port()
            config = gateway_bootstrap(listen, admin, a.grpc_port, "BUFFERED", streams_per_connection=5)
            epp = next(c for c in config["static_resources"]["clusters"] if c["name"] == "epp")
            hosts = epp["load_assignment"]["endpoints"][0]["lb_endpoints"]
            second = json.loads(json.dumps(hosts[0]))
            second["endpoint"]["address"]["socket_address"]["port_value"] = b.grpc_port
            hosts.append(second)  # one ext_proc cluster, two hosts: Envoy balances the streams over both
            with run_envoy(e2e_tmp, config, f"aa-{listen}", 2):
                yield [a, b], f"http://127.0.0.1:{listen}"


async def send(gateway: str, prompts: list[str], concurrency: int) -> list[str]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, prompt: str) -> str:
        body = {"model": "m1", "messages": [{"role": "user", "content": prompt}]}
        async with semaphore, session.post(gateway + CHAT, json=body) as r:
            assert r.status == 200, await r.read()
            return str(json.loads(await r.read())["served_by"])

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        return list(await asyncio.gather(*(one(session, p) for p in prompts)))


async def test_shared_prefixes_land_together_whichever_replica_picks(two_replicas: tuple[list[Picker], str]) -> None:
    pickers, gateway = two_replicas
    before = [requests_served(p) for p in pickers]
    system = [f"system prompt {g}: " + "you are a helpful assistant. " * 12 for g in range(20)]
    first = await send(gateway, [s + "question 0" for s in system], 4)
    later = await send(gateway, [system[g] + f"question {i}" for i in range(1, 5) for g in range(20)], 4)
    same = sum(served == first[i % 20] for i, served in enumerate(later))
    assert same / len(later) >= 0.9, (same, len(later))
    after = [requests_served(p) for p in pickers]
    assert all(b > a for a, b in zip(before, after, strict=True)), (before, after)  # both replicas picked


async def test_a_burst_over_two_replicas_does_not_herd(two_replicas: tuple[list[Picker], str]) -> None:
    _, gateway = two_replicas
    served = Counter(await send(gateway, [f"request {i}: " + "lorem ipsum " * 30 for i in range(100)], 20))
    assert len(served) == ENDPOINTS
    assert max(served.values()) <= 40, served  # the bound tests/e2e/test_workers.py holds one picker to
