"""The federation step of a decision: residency first, then local-or-overflow.

The director calls `route()` once per request, after the gateway's subset hint and before the scheduler:

1. the request's allowance (residency rules ∩ the client's tier header);
2. local endpoints are candidates only if the picker's own tier (`--tier`) is allowed;
3. unsaturated local candidates → the scheduler picks among them, as without federation;
4. otherwise the best eligible remote site in an allowed tier takes the request: its gateway address is the
   destination (one address, like a local pick), and the site is booked in flight;
   A request that already came from another site (`x-epp-federated-from`) is never sent to a site again;
5. no eligible site, but allowed local candidates → stay local (they queue; admission may answer 429);
6. nothing at all → EppError 503 whose reason names the rule — whatever the pool's failureMode, because a
   FailOpen fallback would take the request where the rule forbids it.

Pure: `now` is an argument (the picker's monotonic clock, the one site heartbeats are kept on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epp.config.federation import FederationConfig
from epp.datastore import Snapshot
from epp.datastore.pool import FailureMode
from epp.datastore.sites import SiteRegistry
from epp.datastore.table import IntArray
from epp.errors import ConfigError, EppError, ErrorCode
from epp.federation.policy.overflow import (
    SaturationConfig,
    SiteEntry,
    choose_sites,
    index_sites,
    locally_saturated,
    view_sites,
    why_ineligible,
)
from epp.federation.policy.residency import UNRESTRICTED, Allowance, Residency
from epp.wire import HOP_HEADER

_EMPTY = np.empty(0, dtype=np.int64)

SaturationCheck = Callable[[Snapshot, IntArray, float], bool]


@dataclass(frozen=True, slots=True)
class Route:
    """The federation step's answer: local slots for the scheduler, or a remote site (address list best first)."""

    local: IntArray
    site: str | None = None
    addresses: tuple[str, ...] = ()
    allowance: Allowance = UNRESTRICTED
    headers: tuple[tuple[str, str], ...] = ()  # request headers to add (the hop marker, on a remote pick)


class FederationRouter:
    """Residency and overflow across sites, over the sites registry the federation watch keeps current."""

    def __init__(
        self,
        config: FederationConfig,
        sites: SiteRegistry,
        local_tier: str = "",
        saturated: SaturationCheck | None = None,
    ) -> None:
        self._config = config
        self._sites = sites
        self._local_tier = local_tier
        self._residency = Residency(config)
        self._index: tuple[SiteEntry, ...] = ()
        self._index_version = -1
        default = SaturationConfig()
        self._saturated = saturated or (lambda snap, cands, now: locally_saturated(snap, cands, now, default))

    @property
    def config(self) -> FederationConfig:
        return self._config

    @property
    def local_tier(self) -> str:
        return self._local_tier

    def route(
        self,
        snapshot: Snapshot,
        candidates: IntArray,
        models: Sequence[str],
        objective: str | None,
        headers: Mapping[str, str],
        now: float,
        subset: Sequence[str] | None = None,
    ) -> Route:
        """`models`: the model the client asked for, then the model a rewrite turns it into (if any). A rule that
        names any of them applies: neither renaming a restricted model nor rewriting onto one escapes a rule."""
        allowance = self._residency.allowance(tuple(models), objective, headers)
        local_allowed = allowance.allows(self._local_tier)
        local = candidates if local_allowed else _EMPTY
        may_overflow = len(self._sites) > 0 and HOP_HEADER not in headers
        # Saturation is computed only when a site could take the overflow: without sites it is free.
        if local.size and (not may_overflow or not self._saturated(snapshot, local, now)):
            return Route(local=local, allowance=allowance)
        if may_overflow:
            wanted = frozenset(s.strip() for s in subset) if subset is not None else None
            ranked = choose_sites(
                self._entries(),
                self._sites.inflight,
                allowance,
                self._config.stale_last_resort,
                wanted,
                now,
                self._config.weights,
            )
            if ranked:
                best = ranked[0].name
                self._sites.book(best)
                # One address, like a local pick: an ORIGINAL_DST cluster cannot parse a fallback list (measured with
                # Envoy 1.40: "no original_dst"), and a retry to another site would bypass its in-flight booking.
                address = ranked[0].address
                assert address is not None  # choose_sites keeps only sites with an address
                hop = ((HOP_HEADER, self._local_tier or "unknown"),)
                return Route(local=_EMPTY, site=best, addresses=(address,), allowance=allowance, headers=hop)
        if local.size:
            return Route(local=local, allowance=allowance)
        reason = self._no_candidate_reason(models[0] if models else "", allowance, local_allowed)
        if HOP_HEADER in headers:
            reason += f" (already forwarded by a site, {HOP_HEADER}: not forwarded again)"
        raise EppError(ErrorCode.SERVICE_UNAVAILABLE, reason)

    def _entries(self) -> tuple[SiteEntry, ...]:
        if self._index_version != self._sites.version:
            self._index = index_sites(self._sites.sites(), self._config.phase_rule, self._config.weights)
            self._index_version = self._sites.version
        return self._index

    def release(self, site: str) -> None:
        """A request routed to `site` ended: it no longer counts against that site."""
        self._sites.release(site)

    def _no_candidate_reason(self, model: str, allowance: Allowance, local_allowed: bool) -> str:
        where = f"model {model!r}" if model else "request"
        if allowance.tiers is None:
            return f"no ready endpoint in the pool and no eligible remote site for {where}"
        local = (
            "no ready local endpoint"
            if local_allowed
            else f"local tier {self._local_tier!r} not allowed"
            if self._local_tier
            else "local tier unknown (--tier)"
        )
        return f"{allowance.describe()} for {where}: {local}, and no eligible remote site in those tiers"

    def debug_view(self, now: float) -> list[dict[str, Any]]:
        """Every site with its recomputed phase, the reported one, and why it is (not) routable — for /debug/pool."""
        sites = self._sites.sites()
        inflight = [self._sites.inflight(s.name) for s in sites]
        views = view_sites(sites, inflight, self._config.phase_rule, now, explain=True)
        out = []
        for v in views:
            s = v.site
            problem = why_ineligible(v, UNRESTRICTED)
            out.append(
                {
                    "name": s.name,
                    "tier": s.tier,
                    "address": s.address,
                    "phase": v.phase.value,
                    "phaseReason": v.phase_reason,
                    "reportedPhase": s.reported_phase,
                    "routable": not problem,
                    "notRoutableBecause": problem,
                    "inflight": v.inflight,
                    "gpusAllocatable": s.gpus_allocatable,
                    "servicesReady": s.services_ready,
                    "servicesFailed": s.services_failed,
                }
            )
        return out


def fail_open_conflicts(config: FederationConfig, local_tier: str) -> list[str]:
    """Rules whose traffic local endpoints may not serve: under FailOpen the gateway's fallback path (the picker
    down or erroring) sends such requests to local endpoints and bypasses the rule."""
    conflicts = [r.name for r in config.rules if not local_tier or local_tier not in r.tiers]
    if config.default_tiers is not None and (not local_tier or local_tier not in config.default_tiers):
        conflicts.append("defaultTiers")
    return conflicts


def check_fail_open(config: FederationConfig, local_tier: str, mode: FailureMode, allow: bool, source: str) -> str:
    """Refuse to start a FailOpen pool whose local endpoints may not serve some restricted model.

    Returns "" when fine, or the warning to log when `allow` (the explicit override flag) lets it start anyway.
    """
    if mode is not FailureMode.FAIL_OPEN:
        return ""
    conflicts = fail_open_conflicts(config, local_tier)
    if not conflicts:
        return ""
    what = (
        f"the pool's failureMode is FailOpen but local endpoints (tier {local_tier or 'unknown'!r}) may not serve the "
        f"traffic of residency rule(s) {', '.join(conflicts)}: the gateway's fallback would bypass them"
    )
    if not allow:
        raise ConfigError(
            f"{source}: {what}; set the pool's failureMode to FailClose, or pass --federation-allow-fail-open"
        )
    return f"{what} (allowed by --federation-allow-fail-open)"
