"""`epp serve`'s composition root: `build` wires the endpoint source, the table, the director and the servers from
`ServeSettings`; `start` starts them in order; `stop` stops them in order.

Order on start: endpoint source → director → ext_proc gRPC server → health server → metrics HTTP server; readiness
turns SERVING once the source has synced. On SIGTERM: readiness goes NOT_SERVING at once (gateways stop sending new
streams), the gRPC server stops accepting and gives open streams `--grace-period` seconds to finish, then
everything else stops and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from epp.app.build import (
    Decisions,
    ExtprocServer,
    build_decisions,
    build_director,
    build_processor,
    build_tracing,
    extproc_server,
    load_picker_config,
)
from epp.app.cores import default_workers
from epp.app.endpoints import endpoint_source
from epp.app.federation import FederationParts, build_federation
from epp.app.flow_host import FlowHost
from epp.app.http import build_http_app, pool_report
from epp.app.kv_feeder import KvFeederProcess
from epp.app.kv_metrics import KvEventsCollector, PreciseFallbacksCollector
from epp.app.listen import bind, hostnames
from epp.app.metrics_auth import MetricsAuth
from epp.app.pool_metrics import LatencyCollector, PoolCollector, PrefixCollector
from epp.app.pool_path import check_pools, pools_processor
from epp.app.pools import pools_report
from epp.app.process_metrics import register_process_metrics
from epp.app.receipt_metrics import ReceiptMetrics, active_in
from epp.app.runtime import settle_garbage_collector
from epp.app.scrape_metrics import ScrapeCollector
from epp.app.settings import ServeSettings
from epp.app.state import PickerState, follow_readiness, start_kubernetes
from epp.app.ticket_keys import new_ticket_keys
from epp.app.tls import self_signed_pair
from epp.app.workers import WorkerCollector, WorkerPool, merge_expositions
from epp.config.model import EndpointPickerConfig
from epp.director.flow import FlowGate
from epp.errors import ConfigError
from epp.extproc.server import ExternalProcessor
from epp.flowcontrol import FlowController
from epp.flowcontrol.eviction import EVICTION_FILTER, EVICTION_ORDER, Reclaimer, confirmation_grace
from epp.flowcontrol.gauge import PoolGauge
from epp.observability.collector import FreezableCollector, LoopCollector
from epp.observability.flow import FlowControlMetrics
from epp.observability.logs import configure_logging
from epp.observability.metrics import PickerMetrics
from epp.observability.plugins import PluginTimer
from epp.observability.stderr_json import route_stderr_as_json
from epp.scheduling.build import deprecations
from epp.scheduling.latency_model import absorb_all
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.slo import PredictedLatencyProducer
from epp.scrape.engines import engines_of_config
from epp.scrape.process import ScrapeProcess
from epp.scrape.scraper import ScrapeService
from epp.supervision.loop import run_loop

log = logging.getLogger("epp")


@dataclass
class Picker:
    """Everything `build` made, nothing started yet: what `start` starts and `stop` stops, in their orders."""

    settings: ServeSettings
    state: PickerState
    workers: int
    processor: ExternalProcessor
    grpc_server: ExtprocServer | None  # None with workers: each has its own on the shared port
    health_server: grpc.aio.Server
    scraper: ScrapeService | ScrapeProcess
    http_runner: web.AppRunner
    http_site: web.TCPSite
    flow: FlowGate | None
    kv_feeder: KvFeederProcess | None
    federation: FederationParts | None
    tracer_provider: Any
    tasks: tuple[asyncio.Future[None], ...] = ()  # the site and file watches, from `start`


async def build(settings: ServeSettings) -> Picker:
    """Every part from the settings, each refusal (a bad config, flag or file, a port in use) before anything runs."""
    state = PickerState()
    config = load_picker_config(settings.config)  # first: its dataLayer.discovery may be the endpoint source
    endpoint_source(settings.endpoints, state, config)
    register_process_metrics(state.registry)
    parts = _decision_parts(settings, config, state)
    metrics, processor = _request_path(settings, config, state, parts)
    grpc_server = extproc_server(settings, processor, reuse_port=False) if parts.workers == 1 else None
    if parts.workers > 1:
        state.workers = _worker_pool(settings, parts, state)
        state.registry.register(WorkerCollector(state.workers, metrics.families))
        if parts.flow is not None:  # the picker's one set of queues, here; the workers' requests wait in them
            host = FlowHost(parts.flow, state.workers.send, state.workers.sync_bookings, time.monotonic)
            state.workers.attach_flow(host.receive, host.worker_gone, parts.flow.wake)
        models = [p.model for p in parts.scheduler.learners if isinstance(p, PredictedLatencyProducer)]
        state.workers.attach_learning(lambda learned: absorb_all(models, learned, state.table.slot_of))  # summed
    health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(state.health.servicer, health_server)
    bind(health_server, settings.listen.bind_address, settings.listen.grpc_health_port, "--grpc-health-port")
    scraper = _scraper(settings, parts.decisions, state)
    if state.workers is not None and isinstance(scraper, ScrapeProcess):
        state.workers.share_stamps(scraper.shared_stamps)
    collectors, report = _collectors(state, metrics, parts, scraper), _pool_report(state, parts, scraper)
    http_app = build_http_app(state.registry, report, state.ready, collectors, parts.auth, settings.enable_pprof,
                              state.workers.fresh_expositions if state.workers else None)  # fmt: skip
    http_runner, http_site = await _metrics_site(settings, http_app)
    return Picker(
        settings, state, parts.workers, processor, grpc_server, health_server, scraper, http_runner, http_site,
        parts.flow, parts.kv_feeder, parts.federation, parts.tracer_provider,
    )  # fmt: skip


@dataclass
class _DecisionParts:
    """What decides, beyond the Director: the scheduler (instrumented, traced), the KV-events feeder, federation,
    flow control, and so how many processes serve."""

    decisions: Decisions
    scheduler: Scheduler  # decisions.scheduler, traced with --tracing
    plugin_timer: PluginTimer
    prefix: PrefixCollector
    receipts: ReceiptMetrics
    kv_feeder: KvFeederProcess | None
    federation: FederationParts | None
    flow: FlowGate | None
    tracer_provider: Any
    tracer: Any
    auth: MetricsAuth | None
    workers: int


def _decision_parts(settings: ServeSettings, config: EndpointPickerConfig | None, state: PickerState) -> _DecisionParts:
    decisions = build_decisions(settings, config)
    scheduler = decisions.scheduler
    plugin_timer = PluginTimer()  # registered with the request metrics (`_request_path`): with workers, theirs
    scheduler.instrument(plugin_timer)
    # precise-prefix-cache-producer: the KV-events feeder in its own supervised process, membership from discovery
    kv_feeder = KvFeederProcess(state.table, scheduler.kv_events) if scheduler.kv_events is not None else None
    if kv_feeder is not None:
        state.registry.register(KvEventsCollector(kv_feeder))
    prefix = PrefixCollector.of(scheduler)
    auth = _metrics_auth(settings)
    for warning in settings.startup_warnings:  # after the checks that refuse to start: errors stand alone
        log.warning("%s", warning)
    federation = build_federation(settings.federation, state.failure_mode(), config, scheduler.saturation.saturated)
    for warning in deprecations(config) if config is not None else ():  # after every check that refuses to start
        log.warning("%s: %s", config.source if config is not None else "", warning)
    flow = _flow_gate(scheduler, state, decisions.scrape.interval_s)
    one_process: list[str] = []  # every feature serves on every worker now; a new one that cannot names itself here
    if state.pools is not None:
        check_pools(flow, federation, kv_feeder is not None)
    workers = serving_workers(settings.workers, one_process)
    if kv_feeder is not None and workers == 1:  # with workers, the producers that pick are theirs (summed)
        state.registry.register(PreciseFallbacksCollector(kv_feeder.producer))
    if scheduler.learners:  # with workers, the control process's models are the workers' summed (`build`)
        state.registry.register(LatencyCollector.of(scheduler))
    # With workers, each exports its own spans (epp.app.worker): the control process decides nothing to trace.
    tracer_provider, tracer = build_tracing(settings.tracing) if workers == 1 else (None, None)
    if tracer is not None:
        from epp.app.tracing import traced_scheduler

        scheduler = traced_scheduler(scheduler, tracer)
    if federation is not None:
        federation.connect(settings.kubeconfig)
    return _DecisionParts(
        decisions, scheduler, plugin_timer, prefix, ReceiptMetrics(), kv_feeder, federation, flow, tracer_provider,
        tracer, auth, workers,
    )  # fmt: skip


def _request_path(
    settings: ServeSettings, config: EndpointPickerConfig | None, state: PickerState, parts: _DecisionParts
) -> tuple[PickerMetrics, ExternalProcessor]:
    """The request metrics, the Director (traced with --tracing) and the ext_proc servicer of this process."""
    # With workers, the request metrics are theirs (folded by WorkerCollector, rendered by `metrics.families`): the
    # control process's own would only show zeros under the same names.
    metrics_registry = state.registry if parts.workers == 1 else CollectorRegistry(auto_describe=True)
    metrics_registry.register(parts.prefix)  # the prefix index too: with workers, the indexes that pick are theirs
    metrics_registry.register(parts.plugin_timer)  # and the plugin timings: the workers' picks are the timed ones
    metrics = PickerMetrics(metrics_registry, labels=state.objectives, endpoint_name=state.endpoint_labels)
    metrics_registry.register(parts.receipts)  # with workers, theirs (the alarms' max, the rest summed)
    if state.pools is not None:
        pools = state.pools
        # With workers, the per-pool counts are theirs (summed from their expositions): the control's would be 0s.
        processor = pools_processor(
            settings, config, pools, state.table, metrics_registry, parts.plugin_timer, parts.tracer, metrics,
            receipts=parts.receipts,
        )  # fmt: skip
        return metrics, processor
    director = build_director(
        settings,
        parts.scheduler,
        state.table,
        state.objectives,
        failure_mode=state.failure_mode,
        observer=metrics,
        federation=parts.federation.router if parts.federation is not None else None,
        flow=parts.flow,
        receipts=parts.receipts,
    )
    decider: Any = director
    if parts.tracer is not None:
        from epp.app.tracing import TracingDirector

        decider = TracingDirector(director, parts.tracer)
    return metrics, build_processor(settings, config, decider, metrics)


def _collectors(
    state: PickerState, metrics: PickerMetrics, parts: _DecisionParts, scraper: ScrapeService | ScrapeProcess
) -> list[FreezableCollector]:
    """The pool's and the scraper's collectors registered; every collector of loop-owned numbers, for /metrics to
    freeze on the loop before it renders off it."""
    scrape_collector = LoopCollector(ScrapeCollector(state.table, scraper))
    state.registry.register(scrape_collector)
    pools = state.pools
    pool_keys = (lambda: list(pools.specs)) if pools is not None else None
    pool_collector = PoolCollector(state.table, state.pool_name, _poll_errors(scraper), pool_keys)
    state.registry.register(pool_collector)
    collectors: list[FreezableCollector] = [
        metrics, pool_collector, parts.plugin_timer, parts.prefix, parts.receipts, scrape_collector,
    ]  # fmt: skip
    if parts.flow is not None:
        flow_metrics = FlowControlMetrics(state.registry, state.pool_name, parts.flow.queue_state)
        parts.flow.observer = flow_metrics
        collectors.append(flow_metrics)
    return collectors


def _pool_report(
    state: PickerState, parts: _DecisionParts, scraper: ScrapeService | ScrapeProcess
) -> Callable[[], dict[str, Any]]:
    """/debug/pool: the table as decisions see it, with what each running part says of itself."""
    federation, flow, kv_feeder = parts.federation, parts.flow, parts.kv_feeder
    freshness = parts.scheduler.freshness
    # The latency models: this process's (with workers, the sum of theirs, which `build` wires).
    learners = [p for p in parts.scheduler.learners if isinstance(p, PredictedLatencyProducer)]

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
        if state.workers is not None:  # the workers' alarms, as their expositions last said (any worker's counts)
            extra["degraded"] = active_in(merge_expositions(state.workers.expositions()))
        else:
            extra["degraded"] = parts.receipts.active(now)
        models = {p.name: p.model.report() for p in learners}
        if models:
            extra["latencyModels"] = models
        if state.pools is not None:
            extra["pools"] = pools_report(state.pools, state.table)
        return pool_report(state.table, state.pool, now, state.ready(), freshness, extra or None, statuses)

    return report


async def start(picker: Picker) -> None:
    """Feeders first, then the servers, then readiness (with workers: after the health service, since a worker's
    first "ready" updates it), then the watches."""
    state, settings = picker.state, picker.settings
    await picker.scraper.start()
    if picker.kv_feeder is not None:
        await picker.kv_feeder.start()
    settle_garbage_collector()
    if picker.flow is not None:
        picker.flow.start()
    if picker.grpc_server is not None:
        await picker.grpc_server.start()
    await picker.health_server.start()
    await state.health.start()
    if state.workers is not None:
        await state.workers.start()
    await state.health.set_ready(state.serving())
    if state.kubernetes is not None:
        await start_kubernetes(state.kubernetes, state)
    listen = settings.listen
    log.info(
        "epp serving: ext_proc (%s) on %s:%d (%d worker%s), health on %d, metrics on %d; %d endpoints; pool %s (%s)",
        "TLS" if settings.tls.enabled else "plaintext",
        listen.bind_address,
        listen.grpc_port,
        picker.workers,
        "" if picker.workers == 1 else "s",
        listen.grpc_health_port,
        listen.metrics_port,
        len(state.table),
        state.pool_name(),
        state.failure_mode().value,
    )
    site_watch = picker.federation.start() if picker.federation is not None else None
    file_watch = asyncio.ensure_future(state.file_discovery.run()) if state.file_discovery is not None else None
    picker.tasks = tuple(task for task in (site_watch, file_watch) if task is not None)


async def stop(picker: Picker) -> None:
    """Readiness off at once (a standby takes the Lease), `--drain-timeout` of serving on, `--grace-period` for the
    open streams and the queued requests, then everything else."""
    state, settings = picker.state, picker.settings
    for task in picker.tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    grace_s, drain_s = settings.grace_period_s, settings.drain_timeout_s
    log.info(
        "stopping: readiness off, ext_proc keeps accepting for %.1fs (--drain-timeout), then %s open streams "
        "get %.1fs (--grace-period)",
        drain_s,
        str(picker.processor.open_streams) if state.workers is None else "the workers'",
        grace_s,
    )
    state.stopping = True
    scrape_child = picker.scraper if isinstance(picker.scraper, ScrapeProcess) else None
    for child in (state.workers, scrape_child, picker.kv_feeder):
        if child is not None:
            child.begin_shutdown()  # a child that ends from now on is not restarted (epp.supervision.child)
    await state.health.set_ready(False)
    if state.kubernetes is not None:
        await state.kubernetes.stop()  # releases the Lease now, so a standby takes over during our grace period
    if drain_s > 0:
        await asyncio.sleep(drain_s)  # gateways still holding our address (DNS, EDS) keep being served
    if picker.flow is not None:  # queued requests: dispatched while the grace lasts, the rest answered 503
        await picker.flow.shutdown(grace_s)
    if picker.grpc_server is not None:
        await picker.grpc_server.stop(grace_s)
    if state.workers is not None:
        await state.workers.stop(grace_s)  # every worker drains its own open streams
    await state.health.stopping()
    await picker.health_server.stop(0)
    await picker.scraper.stop()
    if picker.kv_feeder is not None:
        await picker.kv_feeder.stop()
    await picker.http_runner.cleanup()
    if picker.tracer_provider is not None:
        await asyncio.get_running_loop().run_in_executor(None, picker.tracer_provider.shutdown)  # flush what is left
    log.info("stopped")


async def _serve(settings: ServeSettings, stop_requested: asyncio.Event) -> int:
    picker = await build(settings)
    await start(picker)
    try:
        await stop_requested.wait()
    finally:
        await stop(picker)
    return 0


def _worker_pool(settings: ServeSettings, parts: _DecisionParts, state: PickerState) -> WorkerPool:
    """The serving workers; without --cert-path, one self-signed certificate on the port, whichever worker a
    connection reaches; the sites the federation watch keeps and the KV-events feeder's table, passed to every
    worker."""
    tls = settings.tls
    if tls.enabled:  # one set of session-ticket keys: a reconnect resumes on whichever worker it reaches
        tls = replace(tls, ticket_keys=new_ticket_keys())
        if not tls.cert_dir:
            tls = replace(tls, self_signed=self_signed_pair(hostnames(settings.listen.bind_address)))
        settings = replace(settings, tls=tls)
    federation = parts.federation
    return WorkerPool(
        parts.workers,
        settings,
        state.table,
        state.objectives,
        state.failure_mode,
        state.namespace,
        lambda: follow_readiness(state),
        sites=federation.sites if federation is not None else None,
        kv=parts.kv_feeder,
        shared_learners=len(parts.decisions.scheduler.prefix_scorers),
        pools=state.pools,
    )


def _scraper(settings: ServeSettings, decisions: Decisions, state: PickerState) -> ScrapeService | ScrapeProcess:
    """Metric names per engine: built-in, or the config's core-metrics-extractor parameters (upstream's format).
    A child process by default: scraping hundreds of endpoints on the serving loop costs most of its core."""
    engines = engines_of_config(decisions.config)
    if settings.scrape_in_process:
        return ScrapeService(state.table, decisions.scrape, engines)
    return ScrapeProcess(state.table, decisions.scrape, engines)


async def _metrics_site(settings: ServeSettings, app: web.Application) -> tuple[web.AppRunner, web.TCPSite]:
    """The metrics port, bound now: one that cannot be had is a refusal to start, as for the gRPC ports."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.listen.bind_address, settings.listen.metrics_port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"--metrics-port {settings.listen.metrics_port}: cannot listen ({exc.strerror})") from None
    return runner, site


def _flow_gate(scheduler: Scheduler, state: PickerState, scrape_interval_s: float) -> FlowGate | None:
    """Flow control, when the config's `flowControl` feature gate is on: the queues, the dispatch saturation
    (the pool's detector, counting our own picks since the scrape, with the all-stale fallback), the admitters
    and, with `enableEviction`, in-flight eviction paced by the detector's lag."""
    settings = scheduler.flow
    if settings is None:
        return None
    gauge = PoolGauge(scheduler.saturation, scheduler.freshness)
    reclaimer = None
    if settings.spec.enable_eviction:
        grace = confirmation_grace(scheduler.saturation_leads, scrape_interval_s, scheduler.freshness.staleness_s)
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


def _poll_errors(scraper: ScrapeService | ScrapeProcess) -> Callable[[], dict[str, int]]:
    if isinstance(scraper, ScrapeProcess):
        return scraper.poll_errors
    return lambda: dict(scraper.poll_errors)


def _metrics_auth(settings: ServeSettings) -> MetricsAuth | None:
    """--metrics-endpoint-auth: on by default with Kubernetes discovery (as upstream), off without a cluster."""
    if not settings.metrics_auth:
        return None
    from epp.discovery.kubernetes.rest import KubeRest, load_api_client
    from epp.discovery.kubernetes.review import AccessReviewer

    try:
        client = load_api_client(settings.kubeconfig or None)
    except Exception as exc:
        raise ConfigError(f"--metrics-endpoint-auth needs the API server (kubeconfig or in-cluster): {exc}") from None
    return MetricsAuth(AccessReviewer(KubeRest(client)))


async def _main(settings: ServeSettings) -> int:
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    return await _serve(settings, stop_requested)


def serve_from_settings(settings: ServeSettings) -> int:
    logs = settings.logging
    if logs.encoder == "json":  # every line JSON: gRPC core's own lines and the children's stderr too
        route_stderr_as_json(logs.time_encoding)
    configure_logging(logs.verbosity, logs.encoder, logs.level, logs.time_encoding)
    with contextlib.suppress(KeyboardInterrupt):
        return run_loop(_main(settings))
    return 130
