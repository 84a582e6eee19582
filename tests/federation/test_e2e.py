"""End to end on loopback: a local pool and two remote sites, each site a simulated pool behind its own Envoy,
registered as FederatedClusters in a fake API server that a real `epp serve --federation-watch` follows.

    client ──▶ local Envoy ──ext_proc──▶ epp serve (--tier eu)  ◀──watch── fake API server (FederatedClusters)
                   │                                                          ▲ heartbeats (this test)
                   ├──▶ sim-0 (local pool)
                   ├──▶ site-a Envoy ──▶ sim-1      (tier dc)
                   └──▶ site-b Envoy ──▶ sim-2      (tier dc)

Every simulated server names itself in `x-sim-server`, so the test counts where requests landed without trusting
the picker. The model `eu-records` (a LoRA adapter every server serves) is restricted to tier eu by a residency
rule; the base model is unrestricted. Heartbeats are pushed every 0.4 s with `heartbeatIntervalSeconds: 1` and no
cadence clamp, so the rule says Stale 3 s after the last one.

It runs twice: with one serving process, and with two serving workers (`--workers 2`: the watch runs once, in the
control process, and every worker routes on the sites it is sent), where both workers must have taken streams.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epp.gateway.testbed import bootstrap, listener, static_cluster
from epp.sim.config import DEFAULT_MODEL
from epp.sim.server import SERVER_HEADER
from tests.e2e.conftest import Picker
from tests.e2e.test_workers import worker_streams
from tests.fakes.apiserver import DEFAULT_RESOURCES, FakeApiServer, Resource
from tests.support.envoy import envoy, run_envoy
from tests.support.procs import epp_argv, free_port, http_ok, running, wait_until

pytestmark = pytest.mark.e2e

RESTRICTED = "eu-records"
FC = Resource("federation.llmkube.dev", "v1alpha1", "federatedclusters", "FederatedCluster", namespaced=False)
CONFIG = f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{{type: queue-scorer}}]
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: queue-scorer}}]}}]
saturationDetector: {{queueDepthThreshold: 1000, kvCacheUtilThreshold: 0.15, metricsStalenessThreshold: 2s}}
federation:
  heartbeat: {{deliveredCadenceSeconds: 0}}
  residency:
    rules:
      - {{name: eu-records-stay-in-eu, models: [{RESTRICTED}], tiers: [eu]}}
"""


def _fc(name: str, address: str, heartbeat: float) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(heartbeat, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # seconds, as metav1.Time
    return {
        "apiVersion": "federation.llmkube.dev/v1alpha1",
        "kind": "FederatedCluster",
        "metadata": {"name": name, "annotations": {"federation.epp.dev/gateway-address": address}},
        "spec": {"displayName": name, "dataResidencyTier": "dc", "heartbeatIntervalSeconds": 1},
        "status": {
            "lastHeartbeatTime": stamp,
            "capacity": {"nodes": 1, "gpusTotal": 1, "gpusAllocatable": 1},
            "inference": {"models": 2, "servicesTotal": 1, "servicesReady": 1, "servicesFailed": 0},
        },
    }


@dataclass
class Heartbeats:
    """Pushes each beating site's heartbeat every 0.4 s, as LLMKube's edge agent would (bounded by `limit_s`)."""

    api: FakeApiServer
    sites: dict[str, str]  # name → gateway address
    beating: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    limit_s: float = 120.0

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            for name in sorted(self.beating):
                self.api.apply(_fc(name, self.sites[name], time.time()))
            self.stop.wait(0.4)


@dataclass(frozen=True)
class World:
    gateway: str
    debug_url: str
    heartbeats: Heartbeats
    servers: dict[str, str]  # x-sim-server name → "local" | site name
    workers: int
    picker: Picker  # its ports (the metrics port's /metrics tells the workers' streams)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workers = int(request.param)
    tmp = tmp_path_factory.mktemp("federation-e2e")
    sim_argv = [sys.executable, "-m", "epp", "sim", "--servers", "3", "--base-port", "0"]  # ports the OS picks
    sim_argv += ["--profiles", "l4", "--lora", RESTRICTED, "--speed", "2", "--duration", "300"]
    site_ports = {"site-a": free_port(), "site-b": free_port()}
    sites = {name: f"127.0.0.1:{port}" for name, port in site_ports.items()}
    (tmp / "epp.yaml").write_text(CONFIG)
    with FakeApiServer(resources=(*DEFAULT_RESOURCES, FC)) as api, running(sim_argv, tmp / "sim.log") as sim:
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        wait_until(lambda: len(_sim_addresses(tmp / "sim.log")) == 3, 60, "epp sim", sim)
        sim_addresses = _sim_addresses(tmp / "sim.log")
        beats = Heartbeats(api, sites, beating={"site-a", "site-b"})
        thread = threading.Thread(target=beats.run, daemon=True)
        thread.start()
        grpc_port, metrics_port = free_port(), free_port()
        picker_argv = epp_argv(
            "serve",
            "--bind-address=127.0.0.1",
            f"--grpc-port={grpc_port}",
            f"--grpc-health-port={free_port()}",
            f"--metrics-port={metrics_port}",
            f"--static-endpoints={sim_addresses['sim-0']}",
            f"--config-file={tmp / 'epp.yaml'}",
            "--tier=eu",
            "--federation-watch",
            "--grace-period=1",
            f"--workers={workers}",
        )
        try:
            with (  # the picker boots while the sites' Envoys start
                running(picker_argv, tmp / "picker.log", env={"KUBECONFIG": str(kubeconfig)}) as picker,
                run_envoy(tmp, _site_gateway(site_ports["site-a"], _port(sim_addresses["sim-1"])), "site-a"),
                run_envoy(tmp, _site_gateway(site_ports["site-b"], _port(sim_addresses["sim-2"])), "site-b"),
            ):
                debug_url = f"http://127.0.0.1:{metrics_port}/debug/pool"
                wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp serve", picker)
                # A new connection per stream: with workers, the kernel spreads them (and their streams) over both.
                with envoy(tmp, grpc_port, "BUFFERED", streams_per_connection=1, workers=2) as gateway_port:
                    servers = {"sim-0": "local", "sim-1": "site-a", "sim-2": "site-b"}
                    picker = Picker(grpc_port, metrics_port)
                    yield World(f"http://127.0.0.1:{gateway_port}", debug_url, beats, servers, workers, picker)
        finally:
            beats.stop.set()
            thread.join(5)


def _sim_addresses(log: Path) -> dict[str, str]:
    """`epp sim` prints "name ip:port profile engine" per server once all listen."""
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return {parts[0]: parts[1] for parts in lines if len(parts) == 4 and parts[0].startswith("sim-")}


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _site_gateway(listen: int, pool_port: int) -> dict[str, Any]:
    """A site's own gateway: a plain Envoy in front of its (one-server) simulated pool."""
    route = {"route": {"cluster": "site-pool", "timeout": "30s"}}
    return bootstrap([listener("site", listen, route, [])], [static_cluster("site-pool", pool_port)], free_port())


def _phases(world: World) -> dict[str, str]:
    with urllib.request.urlopen(world.debug_url, timeout=2) as response:
        report = json.load(response)
    return {s["name"]: s["phase"] for s in report["federation"]["sites"]}


def _local_kv(world: World) -> float | None:
    """The local endpoint's KV-cache usage as the picker last scraped it (None before the first scrape)."""
    with urllib.request.urlopen(world.debug_url, timeout=2) as response:
        report = json.load(response)
    (endpoint,) = report["endpoints"]
    value = endpoint["metrics"]["kvCacheUsage"]
    return None if value is None else float(value)


def _kv_is(world: World, predicate: Any) -> bool:
    """The local endpoint has been scraped and its KV usage satisfies `predicate`."""
    kv = _local_kv(world)
    return kv is not None and bool(predicate(kv))


async def _wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s}s")


async def _send(session: aiohttp.ClientSession, world: World, model: str, max_tokens: int = 4) -> tuple[int, str]:
    """(status, where it was served: local / site-a / site-b / "" when refused)."""
    body = {"model": model, "prompt": "hello federation", "max_tokens": max_tokens}
    async with session.post(f"{world.gateway}/v1/completions", json=body) as response:
        await response.read()
        return response.status, world.servers.get(response.headers.get(SERVER_HEADER, ""), "")


async def _hold(session: aiohttp.ClientSession, world: World, body: dict[str, Any]) -> None:
    async with session.post(f"{world.gateway}/v1/completions", json=body) as response:
        await response.read()


async def _burst(world: World, model: str, n: int) -> list[tuple[int, str]]:
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return [await _send(session, world, model) for _ in range(n)]


async def test_overflow_residency_and_heartbeats(world: World) -> None:
    await _wait_for(lambda: _phases(world) == {"site-a": "Connected", "site-b": "Connected"}, 20, "sites Connected")

    # 1. Idle local pool: everything stays local.
    await _wait_for(lambda: _kv_is(world, lambda kv: kv < 0.15), 10, "local pool scraped and idle")
    assert {where for _, where in await _burst(world, DEFAULT_MODEL, 4)} == {"local"}

    # 2. Saturate the local pool with long restricted requests (they may never leave, so they load it for sure).
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as load_session:
        # ~4000 prompt tokens each: 2 hold ~25 % of an L4's KV cache for ~15 s (500 tokens at 2× speed). They are
        # left to finish, not cancelled: the simulator stops slowly while it still holds abandoned requests.
        body = {"model": RESTRICTED, "prompt": "x" * 16_000, "max_tokens": 500}
        load = [asyncio.create_task(_hold(load_session, world, body)) for _ in range(2)]
        try:
            await _wait_for(lambda: _kv_is(world, lambda kv: kv >= 0.15), 20, "local pool saturated (KV usage)")

            # Unrestricted traffic overflows to the Connected sites; restricted traffic never leaves.
            results = await _burst(world, DEFAULT_MODEL, 6)
            assert all(status == 200 for status, _ in results), results
            assert {where for _, where in results} <= {"site-a", "site-b"}, results
            for status, where in await _burst(world, RESTRICTED, 4):
                assert where in ("local", "") and (status == 200 or status in (429, 503)), (status, where)

            # 3. Site A stops its heartbeats: once the rule says Stale, no new request goes there.
            world.heartbeats.beating.discard("site-a")
            await _wait_for(lambda: _phases(world)["site-a"] in ("Stale", "Unreachable"), 15, "site-a Stale")
            results = await _burst(world, DEFAULT_MODEL, 6)
            assert [where for _, where in results] == ["site-b"] * 6, results

            # 4. Site A resumes: it is used again.
            world.heartbeats.beating.add("site-a")
            await _wait_for(lambda: _phases(world)["site-a"] == "Connected", 15, "site-a Connected again")
            results = await _burst(world, DEFAULT_MODEL, 6)
            assert "site-a" in {where for _, where in results}, results
            assert {where for _, where in results} <= {"site-a", "site-b"}, results
            if world.workers > 1:  # each worker routed on the sites the control process sent it
                streams = worker_streams(world.picker)
                assert set(streams) == {"0", "1"} and all(n > 0 for n in streams.values()), streams
        finally:
            _, pending = await asyncio.wait(load, timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
