"""`epp serve`'s flags → `ServeSettings`: the one place they are read (after `resolve_upstream_flags` filled in the
defaults that depend on whether there is a cluster)."""

from __future__ import annotations

import argparse

from epp.app.settings import (
    ConfigSource,
    EndpointFlags,
    FederationFlags,
    ListenSettings,
    LogSettings,
    MessageLimits,
    ServeSettings,
)
from epp.cli.scrape_flags import scrape_settings_from_args
from epp.discovery.kubernetes.settings import settings_from_flags
from epp.errors import ConfigError
from epp.extproc.bounds import ServerLimits


def serve_settings(args: argparse.Namespace, startup_warnings: list[str]) -> ServeSettings:
    """The settings the flags ask for; raises ConfigError for values that do not go together (before any port
    opens, so a bad command line exits 2 with one line)."""
    limits = MessageLimits(
        max_body_bytes=args.max_body_bytes,
        streams=ServerLimits(
            max_streams=args.max_concurrent_streams,
            idle_timeout_s=args.stream_idle_timeout,
            max_buffered_bytes=args.max_buffered_body_bytes,
        ),
        grpc_max_recv_msg_size=args.grpc_max_recv_msg_size,
        grpc_max_send_msg_size=args.grpc_max_send_msg_size,
    )
    limits.streams.check(limits.max_body_bytes)
    return ServeSettings(
        listen=ListenSettings(
            bind_address=args.bind_address,
            grpc_port=args.grpc_port,
            grpc_health_port=args.grpc_health_port,
            metrics_port=args.metrics_port,
            transport=args.extproc_transport,
        ),
        config=ConfigSource(
            path=args.config_file or None,
            text=args.config_text,
            allow_experimental=bool(args.allow_experimental_plugins),
        ),
        endpoints=EndpointFlags(
            kubernetes=settings_from_flags(args),
            static_endpoints=args.static_endpoints,
            pool_file=args.pool_file[0] if args.pool_file else None,
            objectives_file=args.objectives_file or None,
            more_pool_files=tuple(args.pool_file[1:]),
            pool_configs=tuple(_pool_config(text) for text in args.pool_config_file),
            pool_less_mode=args.pool_less_failure_mode,
        ),
        limits=limits,
        scrape=scrape_settings_from_args(args),
        scrape_in_process=bool(args.metrics_scrape_in_process),
        federation=FederationFlags(
            tier=args.tier or "",
            watch=bool(args.federation_watch),
            allow_fail_open=bool(args.federation_allow_fail_open),
        ),
        tls=args.tls,
        logging=LogSettings(
            verbosity=args.verbosity,
            encoder=args.zap_encoder,
            level=args.zap_log_level,
            time_encoding=args.zap_time_encoding,
        ),
        workers=args.workers,
        grace_period_s=args.grace_period,
        drain_timeout_s=float(args.drain_timeout or 0.0),
        kubeconfig=args.kubeconfig or "",
        tracing=args.tracing is True,
        metrics_auth=bool(args.metrics_endpoint_auth),
        enable_pprof=bool(args.enable_pprof),
        honour_subset=not args.disable_endpoint_subset_filter,
        test_selection=bool(args.enable_test_endpoint_selection),
        emit_scores=bool(args.emit_endpoint_scores),
        serve_models_list=bool(args.serve_models_list),
        emit_receipts=bool(args.emit_route_receipts),
        receipt_log_every=round(1.0 / args.route_receipt_log_rate) if args.route_receipt_log_rate > 0 else 0,
        startup_warnings=tuple(startup_warnings),
    )


def _pool_config(text: str) -> tuple[str, str]:
    """`--pool-config-file namespace/name=path` (or `name=path`) → (pool, path)."""
    pool, sep, path = text.partition("=")
    if not sep or not pool.strip() or not path.strip():
        raise ConfigError(f"--pool-config-file {text!r}: expected POOL=PATH (namespace/name=config.yaml)")
    return pool.strip(), path.strip()
