"""Leader election through an API-server outage: "lost the lease" and "API server unreachable" are told apart.

Reproduction kept from the hardening probe: with leader election on, an API outage or an expired token turned
readiness off after ~10 s (the renew deadline) although the endpoint set was still right; under FailClose the pool
then answered 503 to every request for the length of an API-server blip.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest

from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.discovery.kubernetes.rest import KubeRest
from epp.discovery.kubernetes.settings import KubernetesSettings, LeaseTiming
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.kubernetes.watch import WatchOptions
from tests.discovery.k8s_objects import pod, pool
from tests.fakes.apiserver import FakeApiServer

LEASE = LeaseTiming(lease_duration_s=2.0, renew_deadline_s=1.5, retry_period_s=0.25)
WATCH = WatchOptions(backoff_initial_s=0.02, backoff_max_s=0.2, inactivity_timeout_s=5, absent_retry_s=0.2)
PAST_EXPIRY_S = LEASE.renew_deadline_s + LEASE.lease_duration_s + 1.0  # beyond anything the lease could promise


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.fixture
async def leader(apiserver: FakeApiServer, rest: KubeRest) -> AsyncIterator[Callable[..., KubernetesSource]]:
    sources: list[KubernetesSource] = []

    async def make(failure_mode: str) -> KubernetesSource:
        apiserver.apply(pool(failure_mode=failure_mode))
        apiserver.apply(pod("vllm-0", ip="127.10.0.7"))
        settings = KubernetesSettings(
            pool_name="pool", leader_election=True, lease=LEASE, identity="a", lease_name="epp", watch=WATCH
        )
        source = KubernetesSource(EndpointTable(), ObjectiveStore(), settings, rest=rest)
        await source.start()
        sources.append(source)
        await until(lambda: source.ready)
        return source

    yield make
    for source in sources:
        await source.stop()


def lease_state(source: KubernetesSource) -> str:
    return str(source.status()["lease"]["state"])


async def test_a_fail_close_leader_stays_ready_through_an_api_outage(apiserver: FakeApiServer, leader) -> None:
    """The probe's 503s: readiness went off after the renew deadline; now it holds while no other holder is known."""
    source = await leader("FailClose")
    apiserver.go_away()
    await until(lambda: lease_state(source) == "holding")  # stepped down by client-go's rules...
    await asyncio.sleep(PAST_EXPIRY_S)
    assert source.ready  # ...but still serving the endpoint set the API server last gave
    assert source.table.addresses() == ["127.10.0.7:8000"]
    assert "503" in (source.status()["lease"]["lastError"] or "")
    apiserver.come_back()
    await until(lambda: lease_state(source) == "leader")
    assert source.ready


async def test_an_expired_token_is_an_outage_too(apiserver: FakeApiServer, leader) -> None:
    source = await leader("FailClose")
    apiserver.token = "rotated"  # every call of ours now gets 401
    await until(lambda: lease_state(source) == "holding")
    await asyncio.sleep(PAST_EXPIRY_S)
    assert source.ready


async def test_the_lease_seen_held_by_another_makes_it_a_follower(apiserver: FakeApiServer, leader) -> None:
    """Lost the lease (another holder known): not ready, whatever the failure mode."""
    source = await leader("FailClose")
    apiserver.token = "rotated"
    await until(lambda: lease_state(source) == "holding")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    apiserver.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "epp", "namespace": "default"},
            "spec": {"holderIdentity": "b", "leaseDurationSeconds": 30, "renewTime": now, "acquireTime": now},
        }
    )
    apiserver.token = "fake-token"  # our calls work again: the next read shows b holding it
    await until(lambda: lease_state(source) == "follower")
    assert not source.ready


async def test_a_fail_open_leader_steps_down_as_client_go_does(apiserver: FakeApiServer, leader) -> None:
    """FailOpen: the gateway balances over the pool without a picker, so the client-go rule stays."""
    source = await leader("FailOpen")
    apiserver.go_away()
    await until(lambda: not source.ready, LEASE.renew_deadline_s + 5)
    assert lease_state(source) == "holding"
    apiserver.come_back()
    await until(lambda: source.ready)
