"""Overflow: when local endpoints count as saturated, and which remote site takes the overflow.

Local endpoints always come first — they are the cheapest hop and the one the gateway's own fallback reaches. They
count as saturated when none has capacity (upstream's saturation detector rule): every candidate either has stale
metrics, a queue at the threshold (counting the picker's own picks the last scrape cannot show yet), or a KV cache
at the threshold. Then eligible remote sites compete.

A site is eligible when it has a gateway address, its tier is allowed, it reports at least one ready inference
service, and the heartbeat rule says Connected (Stale only as a last resort when the config allows it and no
Connected site is eligible; Unreachable never). Eligible sites are ranked by a weighted sum of their free GPUs and
ready services (each relative to the best site), minus their failed-service ratio and the picker's own in-flight
requests per ready service (relative to the busiest): the only signal that moves between two heartbeats, so
overflow spreads instead of herding onto one site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.sites import Site
from epp.datastore.table import IntArray
from epp.federation.phase import Phase, PhaseRule
from epp.federation.policy.config import OverflowWeights, SaturationConfig
from epp.federation.policy.residency import Allowance


def locally_saturated(snapshot: Snapshot, candidates: IntArray, now: float, config: SaturationConfig) -> bool:
    """True when no candidate has capacity (an empty candidate set is saturated too)."""
    if candidates.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        fresh = now - snapshot.scraped_at[candidates] <= config.metrics_staleness_threshold_s  # NaN → not fresh
    fresh &= snapshot.scrape_ok[candidates]
    waiting = np.nan_to_num(snapshot.waiting[candidates], nan=0.0) + snapshot.picks_since_scrape[candidates]
    kv = np.nan_to_num(snapshot.kv_usage[candidates], nan=0.0)  # an engine without KV metrics is not "full"
    has_capacity = fresh & (waiting < config.queue_depth_threshold) & (kv < config.kv_cache_util_threshold)
    return not bool(has_capacity.any())


@dataclass(frozen=True, slots=True)
class SiteView:
    """A site with its phase at `now`, and why it is or is not eligible for a given request (for /debug/pool)."""

    site: Site
    phase: Phase
    phase_reason: str
    inflight: int


def why_ineligible(view: SiteView, allowance: Allowance) -> str:
    """ "" when the site may take this request's overflow (phase aside), else the reason."""
    site = view.site
    if site.address is None:
        return f"no gateway address ({site.address_problem or 'none given'})"
    if not allowance.allows(site.tier):
        return f"tier {site.tier!r} not allowed" if site.tier else "no tier"
    if not site.services_ready:
        return "no ready inference service"
    if view.phase is Phase.UNREACHABLE:
        return "Unreachable"
    return ""


def eligible_sites(
    views: Sequence[SiteView], allowance: Allowance, stale_last_resort: bool, subset: frozenset[str] | None
) -> list[SiteView]:
    """Connected eligible sites; or, when there are none and the config allows it, Stale eligible ones."""
    usable = [v for v in views if not why_ineligible(v, allowance) and (subset is None or v.site.address in subset)]
    connected = [v for v in usable if v.phase is Phase.CONNECTED]
    if connected or not stale_last_resort:
        return connected
    return [v for v in usable if v.phase is Phase.STALE]


def rank_sites(views: Sequence[SiteView], weights: OverflowWeights) -> list[SiteView]:
    """Best first; ties go to fewer in-flight requests, then the name (deterministic)."""
    if len(views) <= 1:
        return list(views)
    gpus = [float(v.site.gpus_allocatable or 0) for v in views]
    ready = [float(v.site.services_ready or 0) for v in views]
    load = [v.inflight / max(ready[i], 1.0) for i, v in enumerate(views)]
    top_gpus, top_ready, top_load = max(gpus), max(ready), max(load)

    def score(i: int) -> float:
        site = views[i].site
        failed = float(site.services_failed or 0)
        total = float(site.services_total or 0) or failed + ready[i]
        return (
            weights.free_gpus * (gpus[i] / top_gpus if top_gpus > 0 else 0.0)
            + weights.ready_services * (ready[i] / top_ready if top_ready > 0 else 0.0)
            - weights.failed_services * (failed / total if total > 0 else 0.0)
            - weights.inflight * (load[i] / top_load if top_load > 0 else 0.0)
        )

    order = sorted(range(len(views)), key=lambda i: (-score(i), views[i].inflight, views[i].site.name))
    return [views[i] for i in order]


def view_sites(sites: Sequence[Site], inflight: Sequence[int], rule: PhaseRule, now: float) -> list[SiteView]:
    views = []
    for site, count in zip(sites, inflight, strict=True):
        phase, reason = rule.explain(site.last_heartbeat, site.heartbeat_interval_s, now)
        views.append(SiteView(site=site, phase=phase, phase_reason=reason, inflight=count))
    return views
