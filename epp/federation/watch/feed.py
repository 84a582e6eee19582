"""FederatedCluster objects (federation.llmkube.dev/v1alpha1, cluster-scoped) folded into the sites registry.

The list/watch itself (recovery rules: re-list on 410, backoff, inactivity timeout) is the generic Kubernetes
watch's job; the composition root feeds its items here: `listed(objects)` for every complete view, `changed(type,
obj)` for every event. This module turns each object into a `Site`:

- the tier is `spec.dataResidencyTier` ("" when absent: such a site never takes restricted traffic);
- the gateway address comes from the picker's config (`federation.sites.<name>`, which wins: the picker's operator
  owns routing) or else from the annotation `federation.epp.dev/gateway-address` on the object. It must be an
  `ip:port` (Envoy routes to it without DNS). A site without a valid address stays visible in /debug/pool, with
  the reason, and is never routed to;
- `status.lastHeartbeatTime` (wall clock, RFC 3339) is mapped to the picker's monotonic clock at receipt, so the
  phase rule compares numbers on one clock and a later jump of the picker's wall clock changes nothing;
- `status.phase` is kept only to show it: the policy recomputes the phase from the heartbeat.

The picker only reads FederatedClusters; it never writes their status (the RBAC sample grants get/list/watch).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from epp.config.federation import parse_address
from epp.datastore.sites import Site, SiteRegistry

log = logging.getLogger(__name__)

GROUP = "federation.llmkube.dev"
VERSION = "v1alpha1"
PLURAL = "federatedclusters"
GATEWAY_ADDRESS_ANNOTATION = "federation.epp.dev/gateway-address"


def parse_timestamp(value: object) -> float | None:
    """RFC 3339 (`2026-11-29T19:00:00Z`, fractions and offsets allowed) → epoch seconds; None when unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:  # Kubernetes always writes UTC; a naive time is read as UTC too
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _interval(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def site_from_object(
    obj: Mapping[str, Any], addresses: Mapping[str, str], wall_now: float, mono_now: float
) -> Site | None:
    """One FederatedCluster as a Site; None for an object without a name (nothing to key it by)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    capacity = status.get("capacity")
    capacity = capacity if isinstance(capacity, Mapping) else {}
    inference = status.get("inference")
    inference = inference if isinstance(inference, Mapping) else {}

    address: str | None = None
    problem = ""
    annotations = meta.get("annotations")
    annotated = annotations.get(GATEWAY_ADDRESS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if name in addresses:
        address = addresses[name]  # validated when the config was parsed
    elif annotated is None:
        problem = f"no {GATEWAY_ADDRESS_ANNOTATION} annotation and no federation.sites entry"
    else:
        try:
            address = parse_address(annotated)
        except ValueError as exc:
            problem = f"annotation {GATEWAY_ADDRESS_ANNOTATION}: {exc}"

    heartbeat_wall = parse_timestamp(status.get("lastHeartbeatTime"))
    last_heartbeat = None if heartbeat_wall is None else mono_now - (wall_now - heartbeat_wall)
    tier = spec.get("dataResidencyTier")
    return Site(
        name=name,
        tier=tier if isinstance(tier, str) else "",
        address=address,
        address_problem=problem,
        display_name=str(spec.get("displayName") or ""),
        heartbeat_interval_s=_interval(spec.get("heartbeatIntervalSeconds")),
        last_heartbeat=last_heartbeat,
        reported_phase=str(status.get("phase") or ""),
        gpus_total=_int(capacity.get("gpusTotal")),
        gpus_allocatable=_int(capacity.get("gpusAllocatable")),
        nodes=_int(capacity.get("nodes")),
        models=_int(inference.get("models")),
        services_total=_int(inference.get("servicesTotal")),
        services_ready=_int(inference.get("servicesReady")),
        services_failed=_int(inference.get("servicesFailed")),
        observed_version=str(status.get("observedVersion") or ""),
    )


class SiteFeed:
    """Writes what the FederatedCluster watch delivers into the registry."""

    def __init__(
        self,
        registry: SiteRegistry,
        addresses: Mapping[str, str],
        wall_clock: Callable[[], float] = time.time,
        mono_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._addresses = addresses
        self._wall = wall_clock
        self._mono = mono_clock

    def _site(self, obj: Mapping[str, Any]) -> Site | None:
        site = site_from_object(obj, self._addresses, self._wall(), self._mono())
        if site is None:
            log.warning("FederatedCluster without metadata.name ignored")
        return site

    def listed(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete view: the registry holds exactly these sites afterwards."""
        sites = [s for s in (self._site(o) for o in objects) if s is not None]
        added, removed = self._registry.replace_all(sites)
        if not self._registry.synced or added or removed:
            log.info("federated sites: %d (%d added, %d removed)", len(self._registry), added, removed)
        for site in sites:
            if site.address is None:
                log.warning("site %s is never routed to: %s", site.name, site.address_problem)
        self._registry.synced = True

    def changed(self, event_type: str, obj: Mapping[str, Any]) -> None:
        site = self._site(obj)
        if site is None:
            return
        if event_type == "DELETED":
            if self._registry.remove(site.name):
                log.info("site %s removed", site.name)
            return
        if site.name not in self._registry:
            log.info("site %s added (tier %r, address %s)", site.name, site.tier, site.address or "none")
            if site.address is None:
                log.warning("site %s is never routed to: %s", site.name, site.address_problem)
        self._registry.put(site)
