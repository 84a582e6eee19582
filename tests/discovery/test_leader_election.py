"""Leader election on a Lease: exactly one ready picker; failover when the leader stops renewing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from epp.discovery.kubernetes.lease import LeaderElector
from epp.discovery.kubernetes.rest import KubeRest
from epp.discovery.kubernetes.settings import LeaseTiming
from tests.discovery.k8s_objects import pod, pool
from tests.discovery.pickers import eventually, served_picker
from tests.fakes.apiserver import FakeApiServer

POOL_LEASE = "epp-default-pool.gateway-api-inference-extension.sigs.k8s.io"
FAST = LeaseTiming(lease_duration_s=2.0, renew_deadline_s=1.5, retry_period_s=0.25)


async def _run_until(predicate, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


def _count_calls(rest: KubeRest) -> dict[str, int]:
    """Counts the elector's API calls (answered and failed), so a test can wait for attempts, not for time."""
    counts = {"ok": 0, "failed": 0}
    call = rest.call

    def counted(*args: Any, **kwargs: Any) -> Any:
        try:
            result = call(*args, **kwargs)
        except Exception:
            counts["failed"] += 1
            raise
        counts["ok"] += 1
        return result

    rest.call = counted  # type: ignore[method-assign]
    return counts


@contextlib.asynccontextmanager
async def campaigning(elector: LeaderElector):
    task = asyncio.create_task(elector.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _frozen() -> float:
    """A clock that never advances: no lease ever expires, so a takeover can only come from a release."""
    return 0.0


async def test_one_of_two_candidates_leads_and_a_clean_stop_hands_over_at_once(
    apiserver: FakeApiServer, rest: KubeRest
) -> None:
    electors = {name: LeaderElector(rest, "default", "epp-lease", name, FAST, clock=_frozen) for name in ("a", "b")}
    tasks = {name: asyncio.create_task(e.run()) for name, e in electors.items()}
    try:
        await _run_until(lambda: any(e.is_leader for e in electors.values()))
        await asyncio.sleep(FAST.retry_period_s * 3)
        assert [e.is_leader for e in electors.values()].count(True) == 1
        leader = next(n for n, e in electors.items() if e.is_leader)
        follower = electors["b" if leader == "a" else "a"]
        tasks[leader].cancel()  # stop as the source does: cancel the campaign, then release
        with contextlib.suppress(asyncio.CancelledError):
            await tasks[leader]
        await electors[leader].release()
        await _run_until(lambda: follower.is_leader)  # handed over, not expired: the clocks never advance
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", "default", "epp-lease")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == follower.identity
    assert lease["spec"]["leaseTransitions"] == 1


async def test_leader_steps_down_when_it_cannot_renew_for_the_renew_deadline(
    apiserver: FakeApiServer, rest: KubeRest
) -> None:
    now = [0.0]
    flips: list[bool] = []
    a = LeaderElector(rest, "default", "epp-lease", "a", FAST, on_change=flips.append, clock=lambda: now[0])
    calls = _count_calls(rest)
    async with campaigning(a):
        await _run_until(lambda: a.is_leader)
        apiserver.token = "revoked"  # every renewal now fails
        await _run_until(lambda: calls["failed"] >= 3)  # from here on no renewal can land
        now[0] = FAST.renew_deadline_s * 0.9  # just short of the deadline since the last renewal
        await _run_until(lambda: calls["failed"] >= 6)
        assert a.is_leader  # failed renewals alone do not depose it before the deadline
        now[0] = FAST.renew_deadline_s + 0.01
        await _run_until(lambda: not a.is_leader)
    assert flips == [True, False]


async def test_a_live_lease_held_by_another_is_respected(apiserver: FakeApiServer, rest: KubeRest) -> None:
    apiserver.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "epp-lease", "namespace": "default"},
            "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 30, "renewTime": "2026-01-01T00:00:00.0Z"},
        }
    )
    now = [0.0]
    a = LeaderElector(rest, "default", "epp-lease", "a", FAST, clock=lambda: now[0])
    calls = _count_calls(rest)
    async with campaigning(a):
        await _run_until(lambda: calls["ok"] >= 2)  # the first answer is processed: the record was seen at 0 s
        now[0] = 29.9  # the holder's 30 s, measured on our own clock since we saw the record, not yet over
        seen = calls["ok"]
        await _run_until(lambda: calls["ok"] >= seen + 3)
        assert not a.is_leader
        now[0] = 30.1  # the holder stopped renewing 30 s ago: the lease is ours to take
        await _run_until(lambda: a.is_leader)
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", "default", "epp-lease")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"


def _lease(api: FakeApiServer) -> dict[str, Any]:
    """The spec of the Lease the pickers of pool `pool` campaign for (named as upstream names it)."""
    lease = api.get("coordination.k8s.io/v1", "Lease", "default", POOL_LEASE)
    assert lease is not None
    return dict(lease["spec"])


@pytest.mark.process
def test_two_picker_processes_exactly_one_ready_and_failover_after_kill(tmp_path: Path) -> None:
    lease, renew = 2.0, 1.5
    flags = (
        "--pool-name",
        "pool",
        "--pool-namespace",
        "default",
        "--ha-enable-leader-election",
        "--leader-elect-lease-duration",
        f"{lease}s",
        "--leader-elect-renew-deadline",
        f"{renew}s",
        "--leader-elect-retry-period",
        "250ms",
    )
    with FakeApiServer() as api:
        api.apply(pool())
        api.apply(pod("vllm-0", ip="127.10.0.1"))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with (
            served_picker(kubeconfig, tmp_path / "a.log", *flags) as a,
            served_picker(kubeconfig, tmp_path / "b.log", *flags) as b,
        ):
            eventually(lambda: a.readiness() or b.readiness(), 10, lambda: "no picker became ready")
            time.sleep(1.0)  # several retry periods: a second leader would show up now
            assert [a.readiness(), b.readiness()].count(True) == 1
            assert a.endpoints() == b.endpoints() == {"127.10.0.1:8000"}  # the standby is hot
            leader, standby = (a, b) if a.readiness() else (b, a)
            held_by = _lease(api)["holderIdentity"]
            leader.proc.kill()  # no release: the standby must wait for the lease to expire
            leader.proc.wait(5)
            eventually(standby.readiness, 60, lambda: "the standby did not take over")
            spec = _lease(api)
            assert spec["holderIdentity"] not in ("", held_by)  # expired and taken, never released
            assert spec["leaseTransitions"] == 1


@pytest.mark.process
def test_sigterm_releases_the_lease_so_the_standby_takes_over_before_it_expires(tmp_path: Path) -> None:
    lease = 3600.0  # an hour: a takeover within the test's minute can only come from the release
    flags = (
        "--pool-name",
        "pool",
        "--ha-enable-leader-election",
        "--leader-elect-retry-period",
        "250ms",
        "--leader-elect-lease-duration",
        f"{lease}s",
        "--leader-elect-renew-deadline",
        "10s",
    )
    with FakeApiServer() as api:
        api.apply(pool())
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        with (
            served_picker(kubeconfig, tmp_path / "a.log", *flags) as a,
            served_picker(kubeconfig, tmp_path / "b.log", *flags) as b,
        ):
            eventually(lambda: a.readiness() or b.readiness(), 10, lambda: "no picker became ready")
            leader, standby = (a, b) if a.readiness() else (b, a)
            held_by = _lease(api)["holderIdentity"]
            leader.proc.terminate()
            eventually(standby.readiness, 60, lambda: "the standby did not take over")
            assert leader.proc.wait(10) == 0
            assert _lease(api)["holderIdentity"] not in ("", held_by)
