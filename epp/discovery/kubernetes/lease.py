"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules (active-passive replicas).

Only the leader reports readiness, so the gateway sends traffic to one picker whose in-flight bookkeeping sees
every request. The rules, as client-go's `leaderelection` package applies them:
- a candidate takes the Lease when it does not exist, has no holder, or has not changed for the holder's
  `leaseDurationSeconds` as measured on the candidate's own monotonic clock since it last saw the record change
  (never by comparing `renewTime` with the local wall clock: clocks of two nodes disagree);
- the leader renews every `retry_period`; when it could not renew for `renew_deadline` it steps down, before a
  follower may take over (renew_deadline < lease_duration), so two leaders never serve at once;
- every write carries the Lease's resourceVersion: of two candidates racing, one gets 409 Conflict and stays a
  follower;
- on a clean stop the leader releases the Lease (empty holder, 1 s duration) so a follower takes over at once.
Every API call blocks, so it runs in a worker thread.

Beyond client-go: a leader that steps down only because the API server did not answer (an outage, an expired
token), with no sign of another holder, is `holding`: the last state it saw says the Lease is its own. What that
means for readiness is the source's choice by the pool's failure mode (docs/failure-modes.md, "Leader election
and API-server outages"). `holding` ends when a renewal succeeds (leader again) or when the Lease is seen held by
another candidate (a follower, for sure).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from epp.discovery.kubernetes.rest import ApiError, KubeRest, ResourceRef
from epp.discovery.kubernetes.settings import LeaseTiming

log = logging.getLogger(__name__)


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease until cancelled; `is_leader` is the current answer, `on_change` hears flips."""

    def __init__(
        self,
        rest: KubeRest,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rest = rest
        self._ref = ResourceRef("coordination.k8s.io", "v1", "leases", namespace=namespace)
        self.name = name
        self.identity = identity
        self._timing = timing
        self._on_change = on_change
        self._clock = clock
        self.is_leader = False
        self.holding = False  # stepped down for want of answers from the API server, no other holder seen
        self.unreachable_since: float | None = None  # first failed renewal of the current outage
        self.last_error: str | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self._resource_version = ""
        self._transitions = 0

    async def run(self) -> None:
        """Acquire, then renew, forever; cancel to stop (then call `release()`)."""
        while True:
            ok = await self._try_acquire_or_renew()
            now = self._clock()
            if ok:
                self._last_renewal = now
                if self.unreachable_since is not None:
                    log.warning(
                        "lease %s: renewed again after %.1fs without the API server",
                        self.name,
                        now - self.unreachable_since,
                    )
                self.unreachable_since = self.last_error = None
                self._set_leader(True)
            elif self.is_leader and now - self._last_renewal >= self._timing.renew_deadline_s:
                outage = self.unreachable_since is not None
                log.warning(
                    "lease %s: not renewed for %.1fs (%s); stepping down%s",
                    self.name,
                    now - self._last_renewal,
                    self.last_error or "no answer",
                    "; no other holder seen: holding the last state" if outage else "",
                )
                self._set_leader(False, holding=outage)
            delay = self._timing.retry_period_s
            await asyncio.sleep(delay if self.is_leader else delay * random.uniform(1.0, 1.2))

    async def release(self) -> None:
        """Give the Lease up if we hold it (best effort: the follower takes over after lease_duration anyway)."""
        if not self.is_leader:
            return
        self._set_leader(False)
        path = self._ref.item_path(self.name)
        try:
            # Read first: a renewal cancelled mid-flight may still have landed, leaving our resourceVersion stale.
            current = await asyncio.to_thread(self._rest.call, "GET", path, None, None, 2.0)
            if (current.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            self._resource_version = str((current.get("metadata") or {}).get("resourceVersion") or "")
            body = self._lease_body(holder="", duration_s=1, acquire_time=_micro_time(), transitions=None)
            await asyncio.to_thread(self._rest.call, "PUT", path, None, body, 2.0)
        except ApiError as exc:
            log.info("lease %s: release failed (%s); it expires by itself", self.name, exc)

    def state(self) -> str:
        """`leader`, `holding` (stepped down for want of API answers, no other holder seen) or `follower`."""
        return "leader" if self.is_leader else "holding" if self.holding else "follower"

    def _set_leader(self, leader: bool, holding: bool = False) -> None:
        holding = holding and not leader
        if leader != self.is_leader or holding != self.holding:
            was_leader = self.is_leader
            self.is_leader, self.holding = leader, holding
            if leader != was_leader:
                log.info("lease %s: %s is %s", self.name, self.identity, "now the leader" if leader else "a follower")
            if self._on_change is not None:
                self._on_change(leader)

    def _unreachable(self, what: str, exc: ApiError) -> None:
        """A call the API server did not answer as an API server that works would (5xx, 401, 403, timeouts)."""
        if self.unreachable_since is None:
            self.unreachable_since = self._clock()
            log.info("lease %s: %s failed: %s", self.name, what, exc)
        self.last_error = f"{what}: {exc}"

    def _lease_body(self, holder: str, duration_s: int, acquire_time: str, transitions: int | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": acquire_time,
            "renewTime": _micro_time(),
        }
        spec["leaseTransitions"] = transitions if transitions is not None else self._transitions
        meta: dict[str, Any] = {"name": self.name, "namespace": self._ref.namespace}
        if self._resource_version:
            meta["resourceVersion"] = self._resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _try_acquire_or_renew(self) -> bool:
        timeout = max(1.0, self._timing.retry_period_s)
        duration = max(1, round(self._timing.lease_duration_s))
        try:
            lease = await asyncio.to_thread(self._rest.call, "GET", self._ref.item_path(self.name), None, None, timeout)
        except ApiError as exc:
            if exc.status != 404:
                self._unreachable("get", exc)
                return False
            self._resource_version = ""
            self._transitions = 0
            body = self._lease_body(self.identity, duration, _micro_time(), 0)
            return await self._write("POST", self._ref.collection_path(), body, timeout)
        spec = lease.get("spec") or {}
        self._resource_version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        record = tuple(spec.get(k) for k in ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions"))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.get("holderIdentity") or ""
        held_for = float(spec.get("leaseDurationSeconds") or duration)
        if holder and holder != self.identity and now < self._observed_at + held_for:
            if self.holding or self.is_leader:
                log.warning("lease %s: held by %s now; a follower", self.name, holder)
            self._set_leader(False)  # someone else holds a live lease (we lost it while partitioned)
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire_time = str(spec.get("acquireTime") or _micro_time())
        else:
            acquire_time, transitions = _micro_time(), transitions + 1
        self._transitions = transitions
        body = self._lease_body(self.identity, duration, acquire_time, transitions)
        return await self._write("PUT", self._ref.item_path(self.name), body, timeout)

    async def _write(self, method: str, path: str, body: dict[str, Any], timeout: float) -> bool:
        try:
            written = await asyncio.to_thread(self._rest.call, method, path, None, body, timeout)
        except ApiError as exc:
            if exc.status != 409:
                self._unreachable(method, exc)
            return False  # 409: another candidate won the race (the next read shows who)
        spec = written.get("spec") or {}
        self._resource_version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        self._observed = tuple(spec.get(k) for k in ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions"))
        self._observed_at = self._clock()
        return True
