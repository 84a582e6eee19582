"""Overflow: when local endpoints count as saturated, and which remote site takes the overflow.

Local endpoints always come first — they are the cheapest hop and the one the gateway's own fallback reaches. They
count as saturated when none has capacity: every candidate either has data that is not usable (the datastore's
`usable` rule: stale, never scraped or failing), a queue at the threshold (counting the picker's own picks the last
scrape cannot show yet), or a KV cache at the threshold. Then eligible remote sites compete.

A site is eligible when it has a gateway address, its tier is allowed, it reports at least one ready inference
service, and the heartbeat rule says Connected (Stale only as a last resort when the config allows it and no
Connected site is eligible; Unreachable never). Eligible sites are ranked by a weighted sum of their free GPUs and
ready services (each relative to the best site), minus their failed-service ratio and the picker's own in-flight
requests per ready service (relative to the busiest): the only signal that moves between two heartbeats, so
overflow spreads instead of herding onto one site.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from epp.config.federation import OverflowWeights
from epp.datastore import Freshness, Snapshot, usable_slots
from epp.datastore.sites import Site
from epp.datastore.table import IntArray
from epp.federation.phase import Deadlines, Phase, PhaseRule
from epp.federation.policy.residency import Allowance


@dataclass(frozen=True, slots=True)
class SaturationConfig:
    """When local endpoints count as saturated, for a router built without the scheduler's saturation detector
    (`epp serve` always passes that one: overflow then starts exactly when shedding would)."""

    queue_depth_threshold: float = 5.0
    kv_cache_util_threshold: float = 0.8
    freshness: Freshness = field(default_factory=Freshness)  # the pool's rule for usable data


def locally_saturated(snapshot: Snapshot, candidates: IntArray, now: float, config: SaturationConfig) -> bool:
    """True when no candidate has capacity (an empty candidate set is saturated too)."""
    if candidates.size == 0:
        return True
    # NaN compares False: `~(x >= threshold)` reads an unknown signal as "not over the threshold" (an engine
    # without KV metrics is not full). Whole columns (short, contiguous) and one gather at the end: cheaper than
    # gathering every column.
    has_capacity = (
        usable_slots(snapshot, now, config.freshness)
        & ~(snapshot.effective_queue() >= config.queue_depth_threshold)
        & ~(snapshot.kv_usage >= config.kv_cache_util_threshold)
    )
    return not bool(has_capacity[candidates].any())


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


@dataclass(frozen=True, slots=True)
class SiteEntry:
    """A site with what does not change until its object does: the phase deadlines and the static score part."""

    site: Site
    deadlines: Deadlines | None
    static_score: float  # free GPUs and ready services relative to the best site, minus the failed-service ratio
    ready: float


def index_sites(sites: Sequence[Site], rule: PhaseRule, weights: OverflowWeights) -> tuple[SiteEntry, ...]:
    """Built once per change of the registry (its version), not per request."""
    gpus = [float(s.gpus_allocatable or 0) for s in sites]
    ready = [float(s.services_ready or 0) for s in sites]
    top_gpus, top_ready = max(gpus, default=0.0), max(ready, default=0.0)
    entries = []
    for i, site in enumerate(sites):
        failed = float(site.services_failed or 0)
        total = float(site.services_total or 0) or failed + ready[i]
        static = (
            weights.free_gpus * (gpus[i] / top_gpus if top_gpus > 0 else 0.0)
            + weights.ready_services * (ready[i] / top_ready if top_ready > 0 else 0.0)
            - weights.failed_services * (failed / total if total > 0 else 0.0)
        )
        deadlines = rule.deadlines(site.last_heartbeat, site.heartbeat_interval_s)
        entries.append(SiteEntry(site=site, deadlines=deadlines, static_score=static, ready=ready[i]))
    return tuple(entries)


def choose_sites(
    entries: Sequence[SiteEntry],
    inflight: Callable[[str], int],
    allowance: Allowance,
    stale_last_resort: bool,
    subset: frozenset[str] | None,
    now: float,
    weights: OverflowWeights,
) -> list[Site]:
    """Eligible sites, best first: Connected ones; or, when there are none and the config allows it, Stale ones.
    Ties go to fewer in-flight requests, then the name (deterministic)."""
    connected: list[SiteEntry] = []
    stale: list[SiteEntry] = []
    for entry in entries:
        site = entry.site
        if (
            site.address is None
            or not site.services_ready
            or entry.deadlines is None
            or not allowance.allows(site.tier)
            or (subset is not None and site.address not in subset)
        ):
            continue
        phase = entry.deadlines.phase(now)
        if phase is Phase.CONNECTED:
            connected.append(entry)
        elif phase is Phase.STALE:
            stale.append(entry)
    chosen = connected if connected or not stale_last_resort else stale
    if len(chosen) <= 1:
        return [e.site for e in chosen]
    counts = [inflight(e.site.name) for e in chosen]
    load = [c / max(e.ready, 1.0) for c, e in zip(counts, chosen, strict=True)]
    top_load = max(load)
    scores = [
        e.static_score - (weights.inflight * load[i] / top_load if top_load > 0 else 0.0) for i, e in enumerate(chosen)
    ]
    order = sorted(range(len(chosen)), key=lambda i: (-scores[i], counts[i], chosen[i].site.name))
    return [chosen[i].site for i in order]


def view_sites(
    sites: Sequence[Site], inflight: Sequence[int], rule: PhaseRule, now: float, explain: bool = False
) -> list[SiteView]:
    """Each site with its phase at `now`; the reasons (strings) only when asked, for /debug/pool."""
    views = []
    for site, count in zip(sites, inflight, strict=True):
        if explain:
            phase, reason = rule.explain(site.last_heartbeat, site.heartbeat_interval_s, now)
        else:
            phase, reason = rule.phase(site.last_heartbeat, site.heartbeat_interval_s, now), ""
        views.append(SiteView(site=site, phase=phase, phase_reason=reason, inflight=count))
    return views
