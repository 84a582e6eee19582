"""`epp serve`: wires the endpoint source, the table, the director and the servers, and stops them in order.

Order on start: endpoint source → director → ext_proc gRPC server → health server → metrics HTTP server; readiness
turns SERVING once the source has synced. On SIGTERM: readiness goes NOT_SERVING at once (gateways stop sending new
streams), the gRPC server stops accepting and gives open streams `--grace-period` seconds to finish, then
everything else stops and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry

from epp.app.config_file import file_discovery_of, load_config, parser_chain_of
from epp.app.cores import default_workers
from epp.app.federation import build_federation
from epp.app.health import HealthState
from epp.app.http import build_http_app, pool_report
from epp.app.kv_feeder import KvFeederProcess
from epp.app.kv_metrics import KvEventsCollector
from epp.app.metrics_auth import MetricsAuth
from epp.app.pool_metrics import PoolCollector, PrefixCollector
from epp.app.scrape_metrics import ScrapeCollector
from epp.app.tls import TlsSettings, self_signed_pair, server_credentials
from epp.app.workers import WorkerCollector, WorkerPool
from epp.cli.scrape_flags import scrape_settings_from_args
from epp.config.model import EndpointPickerConfig
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode, PoolSpec
from epp.director import Director
from epp.director.flow import FlowGate
from epp.discovery.file import FileDiscovery
from epp.discovery.kubernetes.settings import settings_from_flags
from epp.discovery.kubernetes.source import KubernetesSource
from epp.discovery.objectives_file import load_objectives
from epp.discovery.static import load_pool_file, parse_static_endpoints
from epp.errors import ConfigError
from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.flowcontrol import FlowController
from epp.flowcontrol.eviction import EVICTION_FILTER, EVICTION_ORDER, Reclaimer, confirmation_grace
from epp.flowcontrol.gauge import PoolGauge
from epp.observability.flow import FlowControlMetrics
from epp.observability.logs import configure_logging
from epp.observability.metrics import FreezableCollector, LoopCollector, PickerMetrics
from epp.observability.plugins import PluginTimer
from epp.scheduling import ProfileScheduler, build_scheduler
from epp.scheduling.build import deprecations
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.saturation import ConcurrencyDetector
from epp.scrape.engines import engines_of_config
from epp.scrape.process import ScrapeProcess
from epp.scrape.scraper import ScrapeService

log = logging.getLogger("epp")

_WORKER_CONNECTION_AGE_MS = 30_000  # with workers: GOAWAY after this, open streams finish, the next connects anew
_MESSAGE_OVERHEAD = 1 << 20  # an ext_proc message's headers and framing around a body, with plenty of room


@dataclass
class PickerState:
    """What the running picker holds; the composition root owns it, components get only their part."""

    table: EndpointTable = field(default_factory=EndpointTable)
    objectives: ObjectiveStore = field(default_factory=ObjectiveStore)
    pool: PoolSpec | None = None
    health: HealthState = field(default_factory=HealthState)
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    kubernetes: KubernetesSource | None = None
    file_discovery: FileDiscovery | None = None
    workers: WorkerPool | None = None  # --workers N > 1: the serving processes
    stopping: bool = False

    def failure_mode(self) -> FailureMode:
        return self.pool.failure_mode if self.pool is not None else FailureMode.FAIL_CLOSE

    def source_ready(self) -> bool:
        """The endpoint source has delivered its first complete view (readiness also needs leadership, if HA)."""
        if self.kubernetes is not None:
            return self.kubernetes.ready  # synced, pool present, leader (with --ha-enable-leader-election)
        return self.table.synced

    def serving(self) -> bool:
        """Readiness as the picker's state says it should be: the source synced and, with workers, one serving."""
        return self.source_ready() and (self.workers is None or self.workers.serving)

    def ready(self) -> bool:
        """What readiness reports now: off before the source syncs and from the moment the picker is stopping."""
        return self.health.ready


def server_limits(args: argparse.Namespace) -> ServerLimits:
    """The stream bounds (epp/cli/serve.py), checked against each other before any port opens."""
    limits = ServerLimits(
        max_streams=args.max_concurrent_streams,
        idle_timeout_s=args.stream_idle_timeout,
        max_buffered_bytes=args.max_buffered_body_bytes,
    )
    limits.check(args.max_body_bytes)
    return limits


def _endpoint_source(args: argparse.Namespace, state: PickerState, config: EndpointPickerConfig | None) -> None:
    """Kubernetes (pool or standalone selector), or cluster-free: the config's `file-discovery` plugin, or the static
    list; either with an optional pool file (its failureMode) and objectives file."""
    k8s = settings_from_flags(args)
    discovery = file_discovery_of(config)
    objectives_file = getattr(args, "objectives_file", None)
    if k8s is not None:
        if args.static_endpoints is not None or args.pool_file:
            raise ConfigError("--static-endpoints/--pool-file and --pool-name/--endpoint-selector are exclusive")
        if discovery is not None:
            raise ConfigError(
                f"dataLayer.discovery ({discovery.name}) and --pool-name/--endpoint-selector are exclusive: "
                "endpoints come from the file or from the cluster"
            )
        if objectives_file:
            raise ConfigError("--objectives-file is for a cluster-free picker; in a cluster the objectives are watched")
        state.kubernetes = KubernetesSource(state.table, state.objectives, k8s)
        state.kubernetes.connect()  # a bad --kubeconfig ends here, before any port is opened
        state.pool = state.kubernetes.pool_spec()
        return
    if args.pool_file:
        state.pool = load_pool_file(args.pool_file)
    if objectives_file:
        load_objectives(objectives_file, state.objectives)  # a bad file ends here, before any port is opened
    if discovery is not None:
        if args.static_endpoints is not None:
            raise ConfigError(
                f"dataLayer.discovery ({discovery.name}) and --static-endpoints are exclusive: endpoints come from "
                f"{discovery.path}"
            )
        state.file_discovery = FileDiscovery(state.table, discovery.path, discovery.watch_file)
        state.file_discovery.load()  # a file that cannot be read or parsed ends here; readiness after this load
        return
    if args.static_endpoints is None:
        raise ConfigError(
            "no endpoint source: give --static-endpoints ip:port,... (with an optional --pool-file), or a "
            "file-discovery plugin in the config's dataLayer.discovery"
        )
    ports = state.pool.target_ports if state.pool is not None else ()
    state.table.replace_all(parse_static_endpoints(args.static_endpoints, ports))
    state.table.synced = True
    if not len(state.table):
        log.warning("the pool has no endpoints (--static-endpoints is empty): every request gets 503")


async def _serve(args: argparse.Namespace, stop: asyncio.Event) -> int:
    state = PickerState()
    # --config-file / --config-text: an EndpointPickerConfig (refused with exit 2 and the reason); none: built-in.
    # Read first: its dataLayer.discovery may be the endpoint source.
    config_text = getattr(args, "config_text", None)
    allow_experimental = bool(getattr(args, "allow_experimental_plugins", False))  # Alpha types, as upstream
    config: EndpointPickerConfig | None = None
    if config_text is not None:
        config = load_config(None, text=config_text, allow_experimental=allow_experimental, warn=False)
    elif args.config_file:
        config = load_config(args.config_file, allow_experimental=allow_experimental, warn=False)
    _endpoint_source(args, state, config)
    pool_name = state.pool.name if state.pool is not None else "static"
    if state.kubernetes is not None:
        pool_name = state.kubernetes.settings.pool_name or "standalone"
    _register_process_metrics(state.registry)
    scrape = scrape_settings_from_args(args)  # the scrape flags, read once: the scraper and /debug/pool share them
    # One rule for usable endpoint data, for every decision and for /debug/pool: the flags' thresholds, or the
    # config's saturationDetector.metricsStalenessThreshold where it gives one.
    scheduler = build_scheduler(config, seed=None, freshness=scrape.freshness, allow_experimental=allow_experimental)
    scrape = replace(scrape, staleness_s=scheduler.freshness.staleness_s)
    plugin_timer = PluginTimer()
    state.registry.register(plugin_timer)
    scheduler.instrument(plugin_timer)
    # precise-prefix-cache-producer: the KV-events feeder in its own supervised process, membership from discovery
    kv_feeder = _kv_feeder(scheduler, state.table)
    if kv_feeder is not None:
        state.registry.register(KvEventsCollector(kv_feeder))
    prefix = PrefixCollector.of(scheduler)
    auth = _metrics_auth(args, state)
    for warning in getattr(args, "startup_warnings", ()):  # after the checks that refuse to start: errors stand alone
        log.warning("%s", warning)
    tracer_provider, tracer = _tracing(args)
    if tracer is not None and isinstance(scheduler, ProfileScheduler):  # a P/D handler is traced by the director span
        from epp.app.tracing import TracingScheduler

        scheduler = TracingScheduler(scheduler, tracer)  # type: ignore[assignment]
    federation = build_federation(args, state.failure_mode(), config, scheduler.saturation.saturated)
    for warning in deprecations(config) if config is not None else ():  # after every check that refuses to start
        log.warning("%s: %s", config.source if config is not None else "", warning)
    flow = _flow_gate(scheduler, state, scrape.interval_s)
    one_process = [
        what
        for what, used in (
            ("federation", federation is not None),
            ("--tracing", tracer is not None),
            ("the flowControl feature gate", flow is not None),
            ("precise-prefix-cache-producer", kv_feeder is not None),
        )
        if used
    ]
    workers = serving_workers(getattr(args, "workers", 1), one_process)
    if federation is not None:
        federation.connect(getattr(args, "kubeconfig", "") or "")
    # With workers, the request metrics are theirs (summed into /metrics by WorkerCollector): the control process's
    # own would only show zeros under the same names.
    metrics_registry = state.registry if workers == 1 else CollectorRegistry(auto_describe=True)
    metrics_registry.register(prefix)  # the prefix index too: with workers, the indexes that pick are theirs
    metrics = PickerMetrics(metrics_registry, labels=state.objectives, endpoint_name=_endpoint_labels(state))
    director = Director(
        state.table,
        scheduler,
        clock=time.monotonic,
        failure_mode=state.failure_mode,
        observer=metrics,
        objectives=state.objectives,  # priorities (shedding) and model rewrites, as the watches last saw them
        saturation=scheduler.saturation,
        federation=federation.router if federation is not None else None,
        honour_subset=not getattr(args, "disable_endpoint_subset_filter", False),
        test_selection=bool(getattr(args, "enable_test_endpoint_selection", False)),
        emit_scores=bool(getattr(args, "emit_endpoint_scores", False)),
        flow=flow,
    )
    decider: Any = director
    if tracer is not None:
        from epp.app.tracing import TracingDirector

        decider = TracingDirector(director, tracer)
    processor = ExternalProcessor(
        decider,
        metrics,
        StreamSettings(max_body_bytes=args.max_body_bytes, parsers=parser_chain_of(config)),
        limits=server_limits(args),
    )

    tls: TlsSettings = getattr(args, "tls", TlsSettings(enabled=False))
    grpc_server: grpc.aio.Server | None = None
    if workers == 1:
        grpc_server = extproc_server(args, processor, reuse_port=False)
    else:
        if tls.enabled and not tls.cert_dir:  # one certificate on the port, whichever worker a connection reaches
            args.tls = replace(tls, self_signed=self_signed_pair(_hostnames(args.bind_address)))
        state.workers = WorkerPool(
            workers,
            args,
            state.table,
            state.objectives,
            state.failure_mode,
            lambda: state.pool.namespace if state.pool is not None else "",
            lambda: _readiness_changed(state),
        )
        state.registry.register(WorkerCollector(state.workers))
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    from grpc_health.v1 import health_pb2_grpc

    health_pb2_grpc.add_HealthServicer_to_server(state.health.servicer, health_server)
    _bind(health_server, args.bind_address, args.grpc_health_port, "--grpc-health-port")

    # Metric names per engine: built-in, or the config's core-metrics-extractor parameters (upstream's format).
    engines = engines_of_config(config)
    # A child process by default: scraping hundreds of endpoints on the serving loop costs most of its core.
    scraper: ScrapeService | ScrapeProcess
    if getattr(args, "metrics_scrape_in_process", False):
        scraper = ScrapeService(state.table, scrape, engines)
    else:
        scraper = ScrapeProcess(state.table, scrape, engines)
    scrape_collector = LoopCollector(ScrapeCollector(state.table, scraper))
    state.registry.register(scrape_collector)

    def report() -> dict[str, Any]:
        now = time.monotonic()
        extra: dict[str, Any] = {"kubernetes": state.kubernetes.status()} if state.kubernetes is not None else {}
        if federation is not None:
            extra.update(federation.report(now))
        if isinstance(scraper, ScrapeProcess):
            extra["scrapeProcess"] = scraper.supervision(now)
        if state.workers is not None:
            extra["workers"] = state.workers.supervision()
        statuses = {address: status.as_dict() for address, status in scraper.status().items()}
        if flow is not None:
            extra["flowControl"] = flow.report(now)
        if kv_feeder is not None:
            extra["kvEvents"] = kv_feeder.supervision(now)
        return pool_report(state.table, state.pool, now, state.ready(), scheduler.freshness, extra or None, statuses)

    pool_collector = PoolCollector(state.table, lambda: pool_name, _poll_errors(scraper))
    state.registry.register(pool_collector)
    loop_collectors: list[FreezableCollector] = [metrics, pool_collector, plugin_timer, prefix, scrape_collector]
    if flow is not None:
        flow_metrics = FlowControlMetrics(state.registry, lambda: pool_name, flow.queue_state)
        flow.observer = flow_metrics
        loop_collectors.append(flow_metrics)
    stacks = bool(getattr(args, "enable_pprof", False))
    http_app = build_http_app(state.registry, report, state.ready, loop_collectors, auth, stacks)
    http_runner = web.AppRunner(http_app, access_log=None)
    await http_runner.setup()
    site = web.TCPSite(http_runner, args.bind_address, args.metrics_port)
    try:
        await site.start()
    except OSError as exc:
        await http_runner.cleanup()
        raise ConfigError(f"--metrics-port {args.metrics_port}: cannot listen ({exc.strerror})") from None

    await scraper.start()
    if kv_feeder is not None:
        await kv_feeder.start()
    settle_garbage_collector()
    if flow is not None:
        flow.start()
    if grpc_server is not None:
        await grpc_server.start()
    await health_server.start()
    await state.health.start()
    if state.workers is not None:
        await state.workers.start()  # after the health service: a worker's first "ready" updates it
    await state.health.set_ready(state.serving())
    if state.kubernetes is not None:
        await _start_kubernetes(state.kubernetes, state)
    log.info(
        "epp serving: ext_proc (%s) on %s:%d (%d worker%s), health on %d, metrics on %d; %d endpoints; pool %s (%s)",
        "TLS" if tls.enabled else "plaintext",
        args.bind_address,
        args.grpc_port,
        workers,
        "" if workers == 1 else "s",
        args.grpc_health_port,
        args.metrics_port,
        len(state.table),
        pool_name,
        state.failure_mode().value,
    )
    site_watch = federation.start() if federation is not None else None
    file_watch = asyncio.ensure_future(state.file_discovery.run()) if state.file_discovery is not None else None
    try:
        await stop.wait()
    finally:
        for task in (site_watch, file_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        drain_s = float(getattr(args, "drain_timeout", 0.0) or 0.0)
        log.info(
            "stopping: readiness off, ext_proc keeps accepting for %.1fs (--drain-timeout), then %s open streams "
            "get %.1fs (--grace-period)",
            drain_s,
            str(processor.open_streams) if state.workers is None else "the workers'",
            args.grace_period,
        )
        state.stopping = True
        await state.health.set_ready(False)
        if state.kubernetes is not None:
            await state.kubernetes.stop()  # releases the Lease now, so a standby takes over during our grace period
        if drain_s > 0:
            await asyncio.sleep(drain_s)  # gateways still holding our address (DNS, EDS) keep being served
        if flow is not None:  # queued requests: dispatched while the grace lasts, the rest answered 503
            await flow.shutdown(args.grace_period)
        if grpc_server is not None:
            await grpc_server.stop(args.grace_period)
        if state.workers is not None:
            await state.workers.stop(args.grace_period)  # every worker drains its own open streams
        await state.health.stopping()
        await health_server.stop(0)
        await scraper.stop()
        if kv_feeder is not None:
            await kv_feeder.stop()
        await http_runner.cleanup()
        if tracer_provider is not None:
            await asyncio.get_running_loop().run_in_executor(None, tracer_provider.shutdown)  # flush what is left
        log.info("stopped")
    return 0


def extproc_server(args: argparse.Namespace, processor: ExternalProcessor, *, reuse_port: bool) -> grpc.aio.Server:
    """The ext_proc gRPC server on --grpc-port (TLS unless --secure-serving=false); `reuse_port` lets several
    workers bind the same port (the kernel spreads connections over them)."""
    # A BUFFERED body arrives as one message: gRPC's default 4 MiB receive limit would break the stream below
    # --max-body-bytes instead of answering 413, so the limit follows the flag (plus room for the headers), unless
    # upstream's --grpc-max-recv-msg-size sets it.
    receive_limit = getattr(args, "grpc_max_recv_msg_size", None) or args.max_body_bytes + _MESSAGE_OVERHEAD
    options: list[tuple[str, int]] = [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", receive_limit),
    ]
    if getattr(args, "grpc_max_send_msg_size", None):
        options.append(("grpc.max_send_message_length", args.grpc_max_send_msg_size))
    if reuse_port:  # a gateway's long-lived connection moves on now and then, so every worker gets its share
        options.append(("grpc.max_connection_age_ms", _WORKER_CONNECTION_AGE_MS))
    server = grpc.aio.server(options=options)
    add_to_server(processor, server)
    tls: TlsSettings = getattr(args, "tls", TlsSettings(enabled=False))
    credentials = server_credentials(tls, _hostnames(args.bind_address)) if tls.enabled else None
    _bind(server, args.bind_address, args.grpc_port, "--grpc-port", credentials)
    return server


def _readiness_changed(state: PickerState) -> None:
    """A worker started or stopped serving: readiness follows, unless the picker is already stopping."""
    if state.stopping or state.health.ready == state.serving():
        return
    task = asyncio.ensure_future(state.health.set_ready(state.serving()))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


_PENDING: set[asyncio.Future[None]] = set()  # strong references until each health update is done


def _flow_gate(scheduler: Any, state: PickerState, scrape_interval_s: float) -> FlowGate | None:
    """Flow control, when the config's `flowControl` feature gate is on: the queues, the dispatch saturation
    (the pool's detector, counting our own picks since the scrape, with the all-stale fallback), the admitters
    and, with `enableEviction`, in-flight eviction paced by the detector's lag."""
    settings = getattr(scheduler, "flow_control", None)
    if settings is None:
        return None
    gauge = PoolGauge(scheduler.saturation, scheduler.freshness)
    reclaimer = None
    if settings.spec.enable_eviction:
        leading = isinstance(scheduler.saturation, ConcurrencyDetector)
        grace = confirmation_grace(leading, scrape_interval_s, scheduler.freshness.staleness_s)
        reclaimer = Reclaimer(grace)
        log.info("in-flight eviction on: %s, %s, confirmation grace %gs", EVICTION_FILTER, EVICTION_ORDER, grace)
    return FlowGate(
        FlowController(settings),
        state.table,
        gauge,
        time.monotonic,
        objectives=state.objectives,
        admitters=scheduler.admitters,
        reclaimer=reclaimer,
    )


def serving_workers(requested: int | None, one_process: list[str]) -> int:
    """How many serving processes: `--workers N` as given, `auto` (None, the default) the usable cores, capped.
    What needs one process (`one_process`: the features that keep state per decision the workers cannot share
    yet) makes `auto` one process, with a line that says why, and refuses an explicit N above 1."""
    if requested is not None:
        if requested > 1 and one_process:
            raise ConfigError(f"--workers above 1 does not combine with {', '.join(one_process)} yet: use --workers 1")
        return requested
    workers = default_workers()
    if workers > 1 and one_process:
        log.info("--workers auto: one serving process, since %s needs it", ", ".join(one_process))
        return 1
    return workers


def _kv_feeder(scheduler: Any, table: EndpointTable) -> KvFeederProcess | None:
    """The feeder for the config's precise-prefix-cache-producer (one per picker; none without the plugin)."""
    profiles = getattr(scheduler, "profiles", None) or (scheduler,)
    found = {
        id(p): p
        for profile in profiles
        for p in getattr(getattr(profile, "profile", None), "producers", ())
        if isinstance(p, PrecisePrefixCacheProducer)
    }
    if not found:
        return None
    if len(found) > 1:
        raise ConfigError("one precise-prefix-cache-producer per config: its feeder follows every endpoint")
    return KvFeederProcess(table, next(iter(found.values())))


def _poll_errors(scraper: ScrapeService | ScrapeProcess) -> Callable[[], dict[str, int]]:
    if isinstance(scraper, ScrapeProcess):
        return scraper.poll_errors
    return lambda: dict(scraper.poll_errors)


def _endpoint_labels(state: PickerState) -> Callable[[str], tuple[str, str, str]]:
    """address → (pod name, namespace, port) for upstream's endpoint labels."""

    def labels(address: str) -> tuple[str, str, str]:
        slot = state.table.slot_of(address)
        info = state.table.info(slot) if slot is not None else None
        namespace = state.pool.namespace if state.pool is not None else ""
        return (info.pod_name if info is not None and info.pod_name else address), namespace, address.rpartition(":")[2]

    return labels


def _register_process_metrics(registry: CollectorRegistry) -> None:
    """process_* (CPU, memory, fds), python_info and python_gc_*, and upstream's info gauge."""
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, Gauge

    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    from epp import __version__

    for name in ("llm_d_epp_info", "inference_extension_info"):
        info = Gauge(name, "General information of the current build of the endpoint picker.", ["commit", "build_ref"],
                     registry=registry)  # fmt: skip
        info.labels(_commit(), __version__).set(1)


def _commit() -> str:
    import os

    return os.environ.get("EPP_COMMIT", "unknown")


def _metrics_auth(args: argparse.Namespace, state: PickerState) -> MetricsAuth | None:
    """--metrics-endpoint-auth: on by default with Kubernetes discovery (as upstream), off without a cluster."""
    wanted = getattr(args, "metrics_endpoint_auth", None)
    if wanted is None:
        wanted = state.kubernetes is not None
    if not wanted:
        return None
    from epp.discovery.kubernetes.rest import KubeRest, load_api_client
    from epp.discovery.kubernetes.review import AccessReviewer

    try:
        client = load_api_client(getattr(args, "kubeconfig", "") or None)
    except Exception as exc:
        raise ConfigError(f"--metrics-endpoint-auth needs the API server (kubeconfig or in-cluster): {exc}") from None
    return MetricsAuth(AccessReviewer(KubeRest(client)))


def _tracing(args: argparse.Namespace) -> tuple[Any, Any]:
    """(provider, tracer) with `--tracing` and OpenTelemetry installed (the `tracing` extra); (None, None) else."""
    if getattr(args, "tracing", None) is not True:
        return None, None
    try:
        from epp.app.tracing import provider_from_env
    except ImportError:
        log.warning("--tracing: OpenTelemetry is not installed (pip install 'epp-picker[tracing]'); no traces are sent")
        return None, None
    provider = provider_from_env()
    return provider, provider.get_tracer("epp")


async def _start_kubernetes(source: KubernetesSource, state: PickerState) -> None:
    """Start the watches; every change of the pool spec or readiness reaches `state` and the health service."""
    pending: set[asyncio.Task[None]] = set()  # strong references until each health update is done

    def changed() -> None:  # the source stops calling this once its stop() began
        state.pool = source.pool_spec()
        if state.health.ready != state.serving():
            task = asyncio.ensure_future(state.health.set_ready(state.serving()))
            pending.add(task)
            task.add_done_callback(pending.discard)

    source.subscribe(changed)
    await source.start()


def settle_garbage_collector() -> None:
    """Move everything built at start-up out of the collector's sight, and collect the young generation less often.

    Each request allocates a few hundred short-lived objects (protobuf messages, numpy arrays, dicts); with the
    default thresholds the collector runs every few requests and re-walks the long-lived start-up objects
    (modules, the kubernetes client, numpy) on every older-generation pass. Freezing them and raising the
    first threshold cuts that cost without letting cycles build up.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _hostnames(bind_address: str) -> tuple[str, ...]:
    """Names the self-signed certificate carries (nothing verifies it; kept truthful for humans reading it)."""
    names = ["localhost", "127.0.0.1"]
    if bind_address not in ("0.0.0.0", "::", "", *names):
        names.append(bind_address)
    return tuple(names)


def _bind(
    server: grpc.aio.Server, host: str, port: int, flag: str, credentials: grpc.ServerCredentials | None = None
) -> None:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0 and port != 0:
        raise ConfigError(f"{flag} {port}: cannot listen on {address} (in use?)")


async def _main(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return await _serve(args, stop)


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """uvloop when installed (a runtime dependency on Linux): grpc.aio's callbacks and the stream tasks cost
    measurably less per request on it (benchmarks/RESULTS.md); plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def serve_from_args(args: argparse.Namespace) -> int:
    configure_logging(
        args.verbosity,
        getattr(args, "zap_encoder", "console"),
        getattr(args, "zap_log_level", ""),
        getattr(args, "zap_time_encoding", ""),
    )
    with contextlib.suppress(KeyboardInterrupt):
        return run_loop(_main(args))
    return 130
