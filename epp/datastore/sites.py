"""Remote sites (LLMKube FederatedClusters) as the federation watch last saw them, plus the picker's own load on each.

A site is one more destination for the picker: its gateway address (`ip:port` of the site's Envoy) goes into
x-gateway-destination-endpoint exactly like a local pod's. The watch writes `Site` values here; the federation
policy reads `sites()` on every request that may overflow, so the read is a cached tuple, rebuilt only when the
membership changes. The in-flight count per site is the picker's own: it is the one signal about a site that is
always fresh (a site's status is pushed every heartbeat, tens of seconds apart).

Heartbeat times are kept on the picker's monotonic clock (the clock `now` comes from in the director): the watch
maps each wall-clock `lastHeartbeatTime` to that clock when it receives it, so this module and the policy never
read a clock, and a wall-clock jump on the picker's host does not turn every site Stale at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Site:
    """One FederatedCluster as the picker needs it. Unknown numbers are None, never 0 (0 GPUs is a real value)."""

    name: str
    tier: str = ""  # spec.dataResidencyTier; "" = unknown, never allowed by a residency rule
    address: str | None = None  # the site gateway's "ip:port"; None = visible but never routed to
    address_problem: str = ""  # why there is no address (shown in /debug/pool)
    display_name: str = ""
    heartbeat_interval_s: float | None = None  # spec.heartbeatIntervalSeconds (None = absent)
    last_heartbeat: float | None = None  # on the picker's monotonic clock; None = never
    reported_phase: str = ""  # status.phase as written by a hub controller: shown, never trusted
    gpus_total: int | None = None
    gpus_allocatable: int | None = None
    nodes: int | None = None
    models: int | None = None
    services_total: int | None = None
    services_ready: int | None = None
    services_failed: int | None = None
    observed_version: str = ""


class SiteRegistry:
    """Sites by name, and the picker's in-flight requests to each. Not thread-safe: one event loop writes."""

    def __init__(self) -> None:
        self._sites: dict[str, Site] = {}
        self._inflight: dict[str, int] = {}
        self._cache: tuple[Site, ...] | None = ()
        self.version = 0  # bumps on every change of a site's description
        self.synced = False  # the watch (or static config) has delivered a first complete view

    def __len__(self) -> int:
        return len(self._sites)

    def __contains__(self, name: object) -> bool:
        return name in self._sites

    def get(self, name: str) -> Site | None:
        return self._sites.get(name)

    def put(self, site: Site) -> None:
        if self._sites.get(site.name) == site:
            return
        self._sites[site.name] = site
        self._changed()

    def remove(self, name: str) -> bool:
        if self._sites.pop(name, None) is None:
            return False
        self._changed()
        return True

    def replace_all(self, sites: Iterable[Site]) -> tuple[int, int]:
        """Make the registry hold exactly these sites (a list's full view); returns (added, removed)."""
        wanted = {s.name: s for s in sites}
        removed = [n for n in self._sites if n not in wanted]
        for name in removed:
            self.remove(name)
        added = sum(1 for n in wanted if n not in self._sites)
        for site in wanted.values():
            self.put(site)
        return added, len(removed)

    def _changed(self) -> None:
        self._cache = None
        self.version += 1

    def sites(self) -> tuple[Site, ...]:
        """Every site, sorted by name (a stable order makes tie-breaks and tests deterministic)."""
        if self._cache is None:
            self._cache = tuple(self._sites[n] for n in sorted(self._sites))
        return self._cache

    # -- the picker's own load on each site ----------------------------------------------------------------

    def inflight(self, name: str) -> int:
        return self._inflight.get(name, 0)

    def book(self, name: str) -> None:
        self._inflight[name] = self._inflight.get(name, 0) + 1

    def release(self, name: str) -> None:
        """Kept even after the site is removed, so a request that ends later never drives the count negative."""
        count = self._inflight.get(name, 0)
        if count <= 1:
            self._inflight.pop(name, None)
        else:
            self._inflight[name] = count - 1
