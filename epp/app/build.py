"""The one builder of what decides and serves, used by both processes: `epp serve` (`epp.app.serve`) and each
serving worker of `--workers N` (`epp.app.worker`) build their config, scheduler, Director, ExternalProcessor and
ext_proc server here, from the same `ServeSettings`, so the two cannot drift apart.

What only the control process has (discovery, the federation watch, flow control, the scrapers, the HTTP port) is
passed in as parts; a worker passes its own federation router (over the sites the control process sends it) and
builds its own tracer here (`build_tracing`), so each process that decides exports its own spans.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import grpc

from epp.app.config_file import load_config, parser_chain_of
from epp.app.listen import bind, hostnames
from epp.app.receipt_metrics import ReceiptMetrics
from epp.app.settings import ConfigSource, ServeSettings
from epp.app.tls import server_context, server_credentials
from epp.config.model import EndpointPickerConfig
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.director import Director
from epp.director.flow import FlowHold
from epp.director.models import ModelsList
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.federation.policy.router import FederationRouter
from epp.scheduling import Scheduler, build_scheduler
from epp.scrape.scraper import ScrapeSettings

log = logging.getLogger("epp")

_WORKER_CONNECTION_AGE_MS = 30_000  # with workers: GOAWAY after this, open streams finish, the next connects anew
_MESSAGE_OVERHEAD = 1 << 20  # an ext_proc message's headers and framing around a body, with plenty of room


def load_picker_config(source: ConfigSource) -> EndpointPickerConfig | None:
    """--config-file / --config-text: an EndpointPickerConfig (a bad one is ConfigError, exit 2); none: built-in.
    Deprecations are not logged here: the control process logs them once, after every check that refuses to start."""
    if source.text is not None:
        return load_config(None, text=source.text, allow_experimental=source.allow_experimental, warn=False)
    if source.path:
        return load_config(source.path, allow_experimental=source.allow_experimental, warn=False)
    return None


@dataclass(frozen=True, slots=True)
class Decisions:
    """The config and the scheduler built from it, with the scrape settings every judge of endpoint data shares."""

    config: EndpointPickerConfig | None
    scheduler: Scheduler
    scrape: ScrapeSettings  # the flags', with the config's saturationDetector.metricsStalenessThreshold if given


def build_decisions(settings: ServeSettings, config: EndpointPickerConfig | None) -> Decisions:
    """One rule for usable endpoint data, for every decision and for /debug/pool: the flags' thresholds, or the
    config's saturationDetector.metricsStalenessThreshold where it gives one."""
    scheduler = build_scheduler(
        config, seed=None, freshness=settings.scrape.freshness, allow_experimental=settings.config.allow_experimental
    )
    scrape = replace(settings.scrape, staleness_s=scheduler.freshness.staleness_s)
    return Decisions(config, scheduler, scrape)


def build_director(
    settings: ServeSettings,
    scheduler: Scheduler,
    table: EndpointTable,
    objectives: ObjectiveStore,
    *,
    failure_mode: Callable[[], FailureMode],
    observer: Any,
    federation: FederationRouter | None = None,
    flow: FlowHold | None = None,
    pool: str | None = None,
    receipts: ReceiptMetrics | None = None,
) -> Director:
    """The Director over `table`: priorities and rewrites from `objectives` as the watches (or the control process)
    last saw them; the federation router of this process; `flow` is this process's gate, or a serving worker's
    link to the control process's (`epp.director.flow_link`); `receipts` aggregates its route receipts and shows
    its degradation watch; with --serve-models-list its pipeline answers `GET /v1/models` with the pool's models
    (`epp.director.models`)."""
    director = Director(
        table,
        scheduler,
        clock=time.monotonic,
        failure_mode=failure_mode,
        observer=observer,
        objectives=objectives,
        saturation=scheduler.saturation,
        federation=federation,
        honour_subset=settings.honour_subset,
        test_selection=settings.test_selection,
        emit_scores=settings.emit_scores,
        emit_receipts=settings.emit_receipts,
        receipt_log_every=settings.receipt_log_every,
        receipts=receipts,
        flow=flow,
        pool=pool,
    )
    if receipts is not None:
        receipts.attach(director.watch)
    if settings.serve_models_list:
        source = (pool or _owner(settings), objectives, pool is not None)
        director.pipeline = director.pipeline.answering(ModelsList(table, lambda: (source,)).answer)
    return director


def _owner(settings: ServeSettings) -> str:
    """`owned_by` in a one-pool picker's model list: its InferencePool (`namespace/name`), else `epp`."""
    k8s = settings.endpoints.kubernetes
    if k8s is not None and k8s.pool_name:
        return f"{k8s.namespace}/{k8s.pool_name}"
    return "epp"


def build_processor(
    settings: ServeSettings, config: EndpointPickerConfig | None, decider: Any, observer: Any, pools: Any = None
) -> ExternalProcessor:
    """The ext_proc servicer: the config's parsers, the body and stream bounds of the flags; `pools`, with several
    pools, the router that gives each stream its pool's pipeline."""
    stream = StreamSettings(max_body_bytes=settings.limits.max_body_bytes, parsers=parser_chain_of(config))
    limits = settings.limits.streams
    if native_transport(settings):  # no native batch to leak: a stream's status goes out as soon as it ends
        limits = replace(limits, close_grace_s=0.0)
    return ExternalProcessor(decider, observer, stream, limits=limits, pools=pools)


class ExtprocServer(Protocol):
    """What serves the ext_proc port, as the composition root starts and stops it (grpc.aio's server or the
    native front)."""

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> Any: ...


def native_transport(settings: ServeSettings) -> bool:
    """Whether --extproc-transport=native can be had: the compiled framing is optional at install."""
    if settings.listen.transport != "native":
        return False
    try:
        import epp.extproc.native.server  # noqa: F401
    except ImportError as exc:
        log.warning("--extproc-transport=native: the compiled front is not built (%s); serving with grpc", exc)
        return False
    return True


def extproc_server(settings: ServeSettings, processor: ExternalProcessor, *, reuse_port: bool) -> ExtprocServer:
    """The ext_proc server on --grpc-port (TLS unless --secure-serving=false): the native front or grpc.aio's, as
    --extproc-transport says; `reuse_port` lets several workers bind the same port (the kernel spreads connections
    over them)."""
    limits = settings.limits
    # A BUFFERED body arrives as one message: gRPC's default 4 MiB receive limit would break the stream below
    # --max-body-bytes instead of answering 413, so the limit follows the flag (plus room for the headers), unless
    # upstream's --grpc-max-recv-msg-size sets it.
    receive_limit = limits.grpc_max_recv_msg_size or limits.max_body_bytes + _MESSAGE_OVERHEAD
    listen, tls = settings.listen, settings.tls
    if native_transport(settings):
        from epp.extproc.native.server import NativeServer

        return NativeServer(
            processor,
            listen.bind_address,
            listen.grpc_port,
            ssl_context=server_context(tls, hostnames(listen.bind_address)) if tls.enabled else None,
            reuse_port=reuse_port,
            max_message=receive_limit,
            max_age_s=_WORKER_CONNECTION_AGE_MS / 1000 if reuse_port else 0.0,
        )
    options: list[tuple[str, int]] = [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", receive_limit),
    ]
    if limits.grpc_max_send_msg_size:
        options.append(("grpc.max_send_message_length", limits.grpc_max_send_msg_size))
    if reuse_port:  # a gateway's long-lived connection moves on now and then, so every worker gets its share
        options.append(("grpc.max_connection_age_ms", _WORKER_CONNECTION_AGE_MS))
    server = grpc.aio.server(options=options)
    add_to_server(processor, server)
    credentials = server_credentials(tls, hostnames(listen.bind_address)) if tls.enabled else None
    bind(server, listen.bind_address, listen.grpc_port, "--grpc-port", credentials)
    return server


def build_tracing(enabled: bool, worker: int | None = None) -> tuple[Any, Any]:
    """(provider, tracer) with `--tracing` and OpenTelemetry installed (the `tracing` extra); (None, None) else.
    Every process that decides exports its own spans: the control process alone, or each serving worker (`worker`,
    its index, among the resource attributes)."""
    if not enabled:
        return None, None
    try:
        from epp.app.tracing import provider_from_env
    except ImportError:
        if not worker:  # said once, by the control process or the first worker
            log.warning(
                "--tracing: OpenTelemetry is not installed (pip install 'epp-picker[tracing]'); no traces are sent"
            )
        return None, None
    provider = provider_from_env(worker=worker)
    return provider, provider.get_tracer("epp")
