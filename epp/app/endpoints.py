"""Where the endpoints come from, chosen once at start-up: Kubernetes (a pool or a standalone selector), or
cluster-free: the config's `file-discovery` plugin, or the static list; either with an optional pool file (its
failureMode) and objectives file. Every refusal here comes before any port is opened."""

from __future__ import annotations

import logging

from epp.app.config_file import file_discovery_of
from epp.app.pools import StaticPools
from epp.app.settings import EndpointFlags
from epp.app.state import PickerState
from epp.config.model import EndpointPickerConfig
from epp.discovery.file import FileDiscovery
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.objectives_file import load_objectives
from epp.discovery.static import load_pool_file, parse_static_endpoints
from epp.errors import ConfigError
from epp.scheduling.config_plugins import FileDiscoveryPlugin

log = logging.getLogger("epp")


def endpoint_source(flags: EndpointFlags, state: PickerState, config: EndpointPickerConfig | None) -> None:
    """Connect the source the flags and the config name into `state` (its table, objectives and pool)."""
    k8s = flags.kubernetes
    discovery = file_discovery_of(config)
    if k8s is not None:
        if flags.static_endpoints is not None or flags.pool_file:
            raise ConfigError("--static-endpoints/--pool-file and --pool-name/--endpoint-selector are exclusive")
        if discovery is not None:
            raise ConfigError(
                f"dataLayer.discovery ({discovery.name}) and --pool-name/--endpoint-selector are exclusive: "
                "endpoints come from the file or from the cluster"
            )
        if flags.objectives_file:
            raise ConfigError("--objectives-file is for a cluster-free picker; in a cluster the objectives are watched")
        state.kubernetes = KubernetesSource(state.table, state.objectives, k8s)
        state.kubernetes.connect()  # a bad --kubeconfig ends here, before any port is opened
        state.pool = state.kubernetes.pool_spec()
        state.pools = state.kubernetes.pools
        return
    if flags.more_pool_files:
        _pool_files(flags, state, discovery)
        return
    if flags.pool_file:
        state.pool = load_pool_file(flags.pool_file)
    if flags.objectives_file:
        load_objectives(flags.objectives_file, state.objectives)  # a bad file ends here, before any port is opened
    if discovery is not None:
        if flags.static_endpoints is not None:
            raise ConfigError(
                f"dataLayer.discovery ({discovery.name}) and --static-endpoints are exclusive: endpoints come from "
                f"{discovery.path}"
            )
        state.file_discovery = FileDiscovery(state.table, discovery.path, discovery.watch_file)
        state.file_discovery.load()  # a file that cannot be read or parsed ends here; readiness after this load
        return
    if flags.static_endpoints is None:
        raise ConfigError(
            "no endpoint source: give --static-endpoints ip:port,... (with an optional --pool-file), or a "
            "file-discovery plugin in the config's dataLayer.discovery"
        )
    ports = state.pool.target_ports if state.pool is not None else ()
    state.table.replace_all(parse_static_endpoints(flags.static_endpoints, ports))
    state.table.synced = True
    if not len(state.table):
        log.warning("the pool has no endpoints (--static-endpoints is empty): every request gets 503")


def _pool_files(flags: EndpointFlags, state: PickerState, discovery: FileDiscoveryPlugin | None) -> None:
    """Several `--pool-file`s, cluster-free: the endpoints come from the config's file-discovery, each to the pool
    whose selector matches its labels (a static list has no labels to tell the pools apart)."""
    assert flags.pool_file is not None
    if flags.static_endpoints is not None or discovery is None:
        raise ConfigError(
            "several --pool-file: the endpoints come from a file-discovery plugin (dataLayer.discovery), whose "
            "labels each pool's selector matches; --static-endpoints cannot tell the pools apart"
        )
    if flags.objectives_file:
        raise ConfigError("--objectives-file is for one pool; with several --pool-file each pool has no objectives")
    pools = StaticPools([load_pool_file(path) for path in (flags.pool_file, *flags.more_pool_files)])
    state.pools = pools
    state.file_discovery = FileDiscovery(state.table, discovery.path, discovery.watch_file, assign=pools.assign)
    state.file_discovery.load()
