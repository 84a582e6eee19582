"""Wiring of the federation router for `epp serve`: flags and config → router, sites registry and their feed.

Federation is on when the picker is told its tier (`--tier`), the config file has a `federation:` section, or
`--federation-watch` asks to follow FederatedClusters; otherwise the director runs without it, exactly as before.
The start-time residency check lives here too: a FailOpen pool whose local endpoints may not serve some restricted
model is refused (or, with `--federation-allow-fail-open`, started with a loud warning).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from epp.app.settings import FederationFlags
from epp.config.federation import FederationConfig, parse_federation
from epp.config.model import EndpointPickerConfig
from epp.datastore.pool import FailureMode
from epp.datastore.sites import SiteRegistry
from epp.errors import ConfigError
from epp.federation.policy import FederationRouter, check_fail_open
from epp.federation.policy.router import SaturationCheck
from epp.federation.watch import GROUP, PLURAL, VERSION, SiteFeed

log = logging.getLogger("epp.federation")


@dataclass
class FederationParts:
    config: FederationConfig
    sites: SiteRegistry
    router: FederationRouter
    feed: SiteFeed
    watch: bool  # follow FederatedClusters in the cluster
    _rest: Any = None

    def connect(self, kubeconfig: str = "") -> None:
        """Load the Kubernetes client configuration for the watch (kubeconfig, else in-cluster, else $KUBECONFIG).

        Blocking: called at start-up, so a bad `--kubeconfig` ends `epp serve` with one line before serving."""
        if not self.watch or self._rest is not None:
            return
        from epp.discovery.kubernetes.rest import KubeRest, load_api_client

        try:
            self._rest = KubeRest(load_api_client(kubeconfig or None))
        except Exception as exc:  # ConfigException, OSError, YAML errors: all mean "cannot talk to the cluster"
            where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config"
            raise ConfigError(f"--federation-watch: {where}: {' '.join(str(exc).split())}") from None

    async def run_watch(self) -> None:
        """Follow FederatedClusters until cancelled, with the pool watch's recovery rules (re-list on 410, backoff,
        inactivity timeout; a missing CRD is an empty list, looked for again later)."""
        from epp.discovery.kubernetes.rest import ResourceRef
        from epp.discovery.kubernetes.watch import Listed, watch_objects

        if self._rest is None:
            await asyncio.to_thread(self.connect)
        async for item in watch_objects(self._rest, ResourceRef(GROUP, VERSION, PLURAL)):
            if isinstance(item, Listed):
                self.feed.listed(item.objects)
            else:
                self.feed.changed(item.type, item.object)

    def start(self) -> asyncio.Task[None] | None:
        """The watch task when `--federation-watch` asked for one (cancel it to stop)."""
        if not self.watch:
            return None
        task = asyncio.create_task(self.run_watch(), name="federatedcluster-watch")
        task.add_done_callback(_log_crash)
        return task

    def report(self, now: float) -> dict[str, Any]:
        """The `/debug/pool` section: the picker's tier, and every site with its recomputed phase."""
        return {
            "federation": {
                "tier": self.router.local_tier,
                "synced": self.sites.synced,
                "rules": [r.name for r in self.config.rules],
                "sites": self.router.debug_view(now),
            }
        }


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the FederatedCluster watch stopped; sites are no longer updated", exc_info=task.exception())


def worker_federation(
    flags: FederationFlags,
    picker_config: EndpointPickerConfig | None,
    saturated: SaturationCheck | None,
) -> tuple[FederationRouter, SiteRegistry] | None:
    """A serving worker's router, over a registry of its own that the control process fills (`Sites` messages,
    epp.app.worker): the same rules and tier as the control process's, checked and logged there. Until the first
    message the registry is empty and unsynced, so the worker routes nothing remote: residency fails closed."""
    raw = picker_config.federation if picker_config is not None else None
    if raw is None and not flags.tier and not flags.watch:
        return None
    config = parse_federation(raw, picker_config.source if picker_config is not None else "--config-file")
    sites = SiteRegistry()
    return FederationRouter(config, sites, local_tier=flags.tier, saturated=saturated), sites


def build_federation(
    flags: FederationFlags,
    failure_mode: FailureMode,
    picker_config: EndpointPickerConfig | None = None,
    saturated: SaturationCheck | None = None,
) -> FederationParts | None:
    """The federation parts, or None when nothing asks for federation. The rules are the `federation:` section of
    the EndpointPickerConfig (kept raw by the config loader); `saturated` is the scheduler's saturation detector, so
    overflow starts exactly when shedding would. Raises ConfigError for a bad section or a FailOpen pool that would
    leak restricted traffic through the gateway's fallback."""
    raw = picker_config.federation if picker_config is not None else None
    source = picker_config.source if picker_config is not None else "--config-file"
    tier, watch = flags.tier, flags.watch
    if raw is None and not tier and not watch:
        return None
    config = parse_federation(raw, source)
    warning = check_fail_open(config, tier, failure_mode, flags.allow_fail_open, source)
    if warning:
        log.warning("RESIDENCY NOT ENFORCED ON THE FALLBACK PATH: %s", warning)
    sites = SiteRegistry()
    if not watch:
        sites.synced = True  # no site source: the (empty) view is complete
    router = FederationRouter(config, sites, local_tier=tier, saturated=saturated)
    log.info(
        "federation: tier %r, %d residency rule(s), stale sites %s, %s",
        tier,
        len(config.rules),
        "as last resort" if config.stale_last_resort else "excluded",
        "watching FederatedClusters" if watch else "no site watch",
    )
    return FederationParts(
        config=config, sites=sites, router=router, feed=SiteFeed(sites, config.site_addresses), watch=watch
    )
