"""Several pools on the serving workers: `epp serve --pool-selector --workers 2`, three pools of epp sim from the
fake API server behind Envoy (one virtual host per pool). Every worker builds the same per-pool directors from the
membership the control process sends (each endpoint's pool, each pool's failure mode and objectives): 3,000
requests, each checked in Envoy's access log, 0 outside its pool, both workers serving; `/v1/models`
(--serve-models-list) lists each pool's own objective."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from epp.datastore.pool import FailureMode, PoolSpec
from epp.gateway import GatewayOptions, HostPort, bootstrap_dict
from tests.e2e.test_pools import POOLS, World, _access_entries, _load, _pod, _pool, _sim, _sim_ports
from tests.fakes.apiserver import FakeApiServer
from tests.support.envoy import run_envoy
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.e2e

REQUESTS = 3000


def _objective(pool: str) -> dict[str, object]:
    return {
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceObjective",
        "metadata": {"name": f"{pool}-objective", "namespace": "default"},
        "spec": {"priority": 1, "poolRef": {"name": pool}},
    }


@pytest.fixture(scope="module")
def workers_world(envoy_available: None, e2e_tmp: Path) -> Iterator[World]:
    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(e2e_tmp / "pw-kubeconfig")
        with (
            running(_sim("127.0.41.1"), e2e_tmp / "pw-sim-a.log") as a,
            running(_sim("127.0.42.1"), e2e_tmp / "pw-sim-b.log") as b,
            running(_sim("127.0.43.1"), e2e_tmp / "pw-sim-c.log") as c,
        ):
            members: dict[str, set[str]] = {}
            for (name, (ip, mode)), proc, log in zip(POOLS.items(), (a, b, c), "abc", strict=True):
                path = e2e_tmp / f"pw-sim-{log}.log"
                wait_until(lambda path=path: _sim_ports(path, 3) is not None, 60, f"epp sim for {name}", proc)
                ports = _sim_ports(path, 3)
                assert ports is not None
                api.apply(_pool(name, ports, mode))
                api.apply(_pod(f"{name}-0", ip, name))
                api.apply(_objective(name))
                members[name] = {f"{ip}:{p}" for p in ports}
            grpc_port, metrics_port = free_port(), free_port()
            argv = serve_argv(
                grpc_port, free_port(), metrics_port, "--kubeconfig", str(kubeconfig), "--pool-selector",
                "epp=shared", "--metrics-endpoint-auth=false", "--grace-period", "1", "--workers", "2",
                "--serve-models-list",
            )  # fmt: skip
            with running(argv, e2e_tmp / "pw-picker.log") as picker:
                wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp serve", picker)
                listen, admin = free_port(), free_port()
                access_log = e2e_tmp / "pw-access.log"
                specs = [
                    PoolSpec(n, "default", {"pool": n}, (8000,), failure_mode=FailureMode(m))
                    for n, (_, m) in POOLS.items()
                ]
                options = GatewayOptions(
                    pool=specs[0],
                    more_pools=tuple(specs[1:]),
                    epp=HostPort("127.0.0.1", grpc_port),
                    listen=HostPort("127.0.0.1", listen),
                    admin=HostPort("127.0.0.1", admin),
                    access_log=str(access_log),
                    message_timeout_s=10.0,
                    # Envoy spreads streams over the workers by opening connections (SO_REUSEPORT hashes each to
                    # one worker): at the default 1,000 streams each, 3,000 requests are ~4 connections, all on one
                    # worker about one run in eight; 100 makes it ~30 connections.
                    epp_streams_per_connection=100,
                )
                with run_envoy(e2e_tmp, bootstrap_dict(options), "pools-workers", workers=2):
                    yield World(api, f"http://127.0.0.1:{listen}", metrics_port, access_log, members)


def _worker_streams(world: World) -> list[int]:
    with urllib.request.urlopen(world.url("/debug/pool"), timeout=5) as response:
        report = json.load(response)
    return [int(w["streams"]) for w in report["workers"]]


async def test_two_workers_serve_three_pools_and_no_request_leaves_its_pool(workers_world: World) -> None:
    world = workers_world
    results = await _load(world.gateway, [list(POOLS)[i % 3] for i in range(REQUESTS)])
    assert Counter(status for _, status, _ in results) == {200: REQUESTS}
    entries = _access_entries(world.access_log, REQUESTS)
    routed = [e for e in entries if e["status"] == 200 and e.get("path", "/v1/completions") == "/v1/completions"]
    assert len(routed) >= REQUESTS
    outside = [e for e in routed if e["upstream_host"] not in world.members[e["authority"]]]
    assert outside == []  # 0 picks outside the request's pool
    assert set(Counter(e["upstream_host"] for e in routed)) == set().union(*world.members.values())
    streams = _worker_streams(world)
    assert len(streams) == 2 and min(streams) > 0, streams  # both workers served


async def test_each_pools_route_lists_its_own_models_on_the_workers(workers_world: World) -> None:
    world = workers_world
    deadline = time.monotonic() + 10
    async with aiohttp.ClientSession() as session:
        for pool in POOLS:
            while True:
                async with session.get(world.gateway + "/v1/models", headers={"Host": pool}) as r:
                    status, body = r.status, await r.read()
                ids = [m["id"] for m in json.loads(body)["data"]] if status == 200 else []
                if ids == [f"{pool}-objective"] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert status == 200, body
            assert ids == [f"{pool}-objective"]
            assert json.loads(body)["data"][0]["owned_by"] == f"default/{pool}"
