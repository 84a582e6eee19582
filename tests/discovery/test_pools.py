"""One Kubernetes source over several InferencePools (repeated --pool-name, --pool-selector) against the fake API
server: each endpoint keyed with its pool, pools added and removed at run time, objectives per pool, and only
the calls the single-pool RBAC grants."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.discovery.kubernetes.rest import KubeRest
from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.kubernetes.watch import WatchOptions
from tests.discovery.k8s_objects import objective, pod, pool
from tests.fakes.apiserver import FakeApiServer

FAST = WatchOptions(backoff_initial_s=0.02, backoff_max_s=0.1, inactivity_timeout_s=5, absent_retry_s=0.2)
POOL = ("inference.networking.k8s.io/v1", "InferencePool")


def labelled(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    obj["metadata"]["labels"] = dict(labels)
    return obj


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> float:
    """Seconds until `predicate` holds (fails after `timeout_s`)."""
    started = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)
    return time.monotonic() - started


def by_pool(table: EndpointTable) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for address in table.addresses():
        slot = table.slot_of(address)
        info = table.info(slot) if slot is not None else None
        assert info is not None
        out.setdefault(info.pool, set()).add(address)
    return out


@pytest.fixture
async def start(rest: KubeRest) -> AsyncIterator[Callable[..., Any]]:
    sources: list[KubernetesSource] = []

    async def make(**settings: Any) -> KubernetesSource:
        source = KubernetesSource(
            EndpointTable(), ObjectiveStore(), KubernetesSettings(watch=FAST, **settings), rest=rest
        )
        await source.start()
        sources.append(source)
        return source

    yield make
    for source in sources:
        await source.stop()


def three_pools(apiserver: FakeApiServer) -> None:
    for name, port, mode in (("a", 8000, "FailClose"), ("b", 8001, "FailOpen"), ("c", 8002, "FailClose")):
        apiserver.apply(labelled(pool(f"pool-{name}", {"app": name}, (port,), mode), epp="shared"))
        apiserver.apply(pod(f"{name}-0", ip=f"127.20.{ord(name) - 96}.1", labels={"app": name}))
        apiserver.apply(pod(f"{name}-1", ip=f"127.20.{ord(name) - 96}.2", labels={"app": name}))


async def test_named_pools_each_keep_their_endpoints_target_ports_and_failure_mode(apiserver, start) -> None:
    three_pools(apiserver)
    source = await start(pool_names=("pool-a", "pool-b"))
    await until(lambda: source.ready and len(source.table) == 4)
    assert by_pool(source.table) == {
        "default/pool-a": {"127.20.1.1:8000", "127.20.1.2:8000"},
        "default/pool-b": {"127.20.2.1:8001", "127.20.2.2:8001"},
    }  # pool-c is in the namespace but not named
    assert source.pools is not None
    assert {k: s.failure_mode for k, s in source.pools.specs.items()} == {
        "default/pool-a": FailureMode.FAIL_CLOSE,
        "default/pool-b": FailureMode.FAIL_OPEN,
    }
    assert source.pool_spec() is None  # no single pool


async def test_pools_matching_the_selector_added_and_removed_at_run_time_converge_within_2s(apiserver, start) -> None:
    three_pools(apiserver)
    source = await start(pool_selector="epp=shared")
    await until(lambda: source.ready and len(source.table) == 6)
    apiserver.apply(labelled(pool("pool-d", {"app": "d"}, (8003,)), epp="shared"))
    apiserver.apply(pod("d-0", ip="127.20.4.1", labels={"app": "d"}))
    added = await until(lambda: by_pool(source.table).get("default/pool-d") == {"127.20.4.1:8003"}, 2.0)
    apiserver.delete(*POOL, "default", "pool-b")
    removed = await until(lambda: "default/pool-b" not in by_pool(source.table), 2.0)
    apiserver.apply(labelled(pool("pool-c", {"app": "c"}, (8002,)), epp="other"))  # relabelled: no longer matches
    relabelled = await until(lambda: "default/pool-c" not in by_pool(source.table), 2.0)
    assert max(added, removed, relabelled) < 2.0
    assert set(by_pool(source.table)) == {"default/pool-a", "default/pool-d"}
    assert source.ready


async def test_a_pod_scaled_away_leaves_only_its_pool(apiserver, start) -> None:
    three_pools(apiserver)
    source = await start(pool_selector="epp=shared")
    await until(lambda: len(source.table) == 6)
    apiserver.delete("v1", "Pod", "default", "b-0")
    apiserver.delete("v1", "Pod", "default", "b-1")
    await until(lambda: "default/pool-b" not in by_pool(source.table))
    assert {k: len(v) for k, v in by_pool(source.table).items()} == {"default/pool-a": 2, "default/pool-c": 2}
    assert "default/pool-b" in source.pools.specs  # the pool itself is still served, empty: its own failure mode


async def test_each_pool_has_the_objectives_that_name_it(apiserver, start) -> None:
    three_pools(apiserver)
    apiserver.apply(objective("critical-a", 10, pool_name="pool-a", group="llm-d.ai"))
    apiserver.apply(objective("batch-b", -1, pool_name="pool-b", group="llm-d.ai"))
    source = await start(pool_names=("pool-a", "pool-b"))
    assert source.pools is not None
    a, b = source.pools.objectives_of("default/pool-a"), source.pools.objectives_of("default/pool-b")
    await until(lambda: a.objectives() == {"critical-a": 10} and b.objectives() == {"batch-b": -1})


async def test_an_address_two_pools_select_stays_with_the_first(apiserver, start) -> None:
    apiserver.apply(pool("pool-a", {"app": "x"}, (8000,)))
    apiserver.apply(pool("pool-b", {"app": "x"}, (8000,)))
    apiserver.apply(pod("x-0", ip="127.20.9.1", labels={"app": "x"}))
    source = await start(pool_names=("pool-a", "pool-b"))
    await until(lambda: len(source.table) == 1 and source.ready)
    assert by_pool(source.table) == {"default/pool-a": {"127.20.9.1:8000"}}


async def test_several_pools_make_only_the_calls_the_single_pool_rbac_grants(apiserver, start) -> None:
    three_pools(apiserver)
    source = await start(pool_selector="epp=shared")
    await until(lambda: source.ready and len(source.table) == 6)
    await until(lambda: any(c.verb == "watch" and "/inferencepools" in c.path for c in apiserver.calls))
    calls = [c for c in apiserver.calls if "/inferencepools" in c.path]
    pool_calls = {c.verb for c in calls}
    assert pool_calls == {"list", "watch"}  # manifests/base/rbac.yaml: list and watch of inferencepools, namespaced
    assert all("/namespaces/default/" in c.path for c in calls)
