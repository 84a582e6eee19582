"""`epp serve`: the picker itself, with upstream's flags and ports."""

from __future__ import annotations

import argparse
import os
from typing import Any

from epp.app.cores import MAX_DEFAULT_WORKERS
from epp.app.tls import tls_policy
from epp.cli.flag_types import duration, positive_duration
from epp.cli.scrape_flags import add_scrape_flags
from epp.cli.serve_settings import serve_settings
from epp.cli.upstream_flags import add_upstream_flags, go_bool, resolve_upstream_flags
from epp.extproc.native import native_front_built


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {value}")
    return value


def _positive_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


class _PoolName(argparse.Action):
    """`--pool-name` as upstream's single value (`args.pool_name`, the first given), every value given in
    `args.pool_names`: a repeated flag serves several pools."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        names = [*(getattr(namespace, "pool_names", None) or ()), str(values)]
        namespace.pool_names = names
        namespace.pool_name = names[0]


def _register_kubernetes(p: argparse.ArgumentParser) -> None:
    """Upstream's names; lease tuning as client-go components name it (upstream uses client-go's defaults)."""
    k = p.add_argument_group("Kubernetes (see docs/kubernetes.md)")
    k.add_argument(
        "--pool-name",
        action=_PoolName,
        default="",
        help="name of the InferencePool this picker serves; repeat it to serve several (docs/kubernetes.md)",
    )
    k.add_argument(
        "--pool-selector",
        default="",
        help="serve every InferencePool of the namespace whose labels match this selector, e.g. 'epp=shared'",
    )
    k.add_argument(
        "--pool-namespace", default="", help="namespace of the InferencePool (default: env NAMESPACE, else default)"
    )
    k.add_argument(
        "--pool-group",
        default="inference.networking.k8s.io",
        help="API group of the InferencePool (default inference.networking.k8s.io)",
    )
    k.add_argument("--kubeconfig", default="", help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
    k.add_argument(
        "--endpoint-selector",
        default="",
        help="standalone mode, no pool object: a label selector, e.g. 'app=vllm,env in (a,b),tier!=x,gpu,!canary'",
    )
    k.add_argument("--endpoint-target-ports", default="", help="standalone mode: model-server ports, e.g. 8000,8001")
    k.add_argument(
        "--ha-enable-leader-election",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        help="active-passive replicas: only the holder of the Lease reports readiness",
    )
    k.add_argument(
        "--leader-elect-lease-duration", type=positive_duration, default=15.0, help="lease duration (default 15s)"
    )
    k.add_argument(
        "--leader-elect-renew-deadline", type=positive_duration, default=10.0, help="renew deadline (default 10s)"
    )
    k.add_argument("--leader-elect-retry-period", type=positive_duration, default=2.0, help="retry period (default 2s)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def _register_stream_bounds(p: argparse.ArgumentParser) -> None:
    """What one picker holds for the gateway at most (docs/failure-modes.md); each refusal is counted."""
    from epp.extproc.bounds import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_STREAMS

    p.add_argument(
        "--max-concurrent-streams",
        type=_positive_int,
        default=DEFAULT_MAX_STREAMS,
        help=f"ext_proc streams open at once; more get 503 (default {DEFAULT_MAX_STREAMS})",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=positive_duration,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help="a stream with no message for this long is ended: 503 if its request was not complete (default 5m)",
    )
    p.add_argument(
        "--max-buffered-body-bytes",
        type=_positive_bytes,
        default=DEFAULT_MAX_BUFFERED_BYTES,
        help="request-body bytes buffered across all streams; a body that would pass it gets 429 (default 256 MiB)",
    )


def _workers(text: str) -> int | None:
    """A worker count, or None for `auto` (the default): the usable cores, capped (epp.app.cores), resolved when
    `epp serve` knows whether its configuration can run in several processes."""
    if text == "auto":
        return None
    value = _positive_int(text)
    if value > 64:
        raise argparse.ArgumentTypeError(f"at most 64 workers, got {value}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share between 0 and 1, got {value}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the endpoint picker (ext_proc gRPC server)")
    p.add_argument("--grpc-port", type=_port, default=9002, help="ext_proc gRPC port (default 9002)")
    p.add_argument(
        "--extproc-transport",
        choices=("native", "grpc"),
        default="native",
        help="what serves the ext_proc port: 'native' (HTTP/2 and gRPC framing in C, the stream in Python; falls "
        "back to grpc when the extension is not built) or 'grpc' (grpcio's grpc.aio server) (default native)",
    )
    p.add_argument("--grpc-health-port", type=_port, default=9003, help="gRPC health port (default 9003)")
    p.add_argument("--metrics-port", type=_port, default=9090, help="Prometheus /metrics and /debug (default 9090)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address the servers listen on (default 0.0.0.0)")
    p.add_argument("--config-file", help="EndpointPickerConfig YAML (default: the built-in profile)")
    p.add_argument(
        "--objectives-file",
        help="cluster-free mode: InferenceObjective / InferenceModelRewrite YAML documents (priorities, rewrites)",
    )
    p.add_argument("--static-endpoints", help="cluster-free mode: comma list of ip:port endpoints")
    p.add_argument(
        "--pool-file",
        action="append",
        default=[],
        help="cluster-free mode: an InferencePool v1 YAML (its failureMode is honoured); repeat it to serve several",
    )
    p.add_argument(
        "--pool-config-file",
        action="append",
        default=[],
        metavar="POOL=PATH",
        help="several pools: an EndpointPickerConfig for one pool (namespace/name or name); others use --config-file",
    )
    p.add_argument(
        "--pool-less-failure-mode",
        choices=("FailClose", "Reject"),
        default="FailClose",
        help="several pools: a request whose pool cannot be told gets 503 (FailClose, default) or 400 (Reject)",
    )
    p.add_argument(
        "--serve-models-list",
        action="store_true",
        help="answer GET /v1/models from the pools served (objectives, rewrites, LoRA adapters) instead of "
        "routing it to an endpoint (docs/kubernetes.md)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=_positive_bytes,
        default=16 * 1024 * 1024,
        help="largest request body accepted; larger gets 413 (default 16 MiB)",
    )
    _register_stream_bounds(p)
    p.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="serving processes sharing the ext_proc port (SO_REUSEPORT); 1: one process serves; 'auto' (default): "
        "the cores this process may use (CPU affinity, lowered by the container's CPU limit: cgroup cpu.max or "
        f"cfs quota, whole cores), at most {MAX_DEFAULT_WORKERS}; flow control, federation, --tracing and "
        "precise-prefix-cache-producer run on every worker",
    )
    p.add_argument(
        "--emit-route-receipts",
        action="store_true",
        help="write each pick's route receipt (JSON: each scorer's weight x score for the chosen endpoint and the "
        "runner-up, data ages, producers and fallbacks, profiles, flow-control wait) into envoy.lb metadata "
        "(x-llm-d-route-receipt), with the endpoint scores of --emit-endpoint-scores (default off)",
    )
    p.add_argument(
        "--route-receipt-log-rate",
        type=_rate,
        default=0.0,
        help="share of the receipts read that are also logged as one JSON line at INFO, 0-1 (default 0: none); "
        "without --emit-route-receipts one pick in 32 is read",
    )
    p.add_argument(
        "--grace-period",
        type=duration,
        default=10.0,
        help="how long open streams get to finish after SIGTERM, e.g. 10s, 500ms or seconds (default 10s)",
    )
    add_scrape_flags(p)
    fed = p.add_argument_group("federation (LLMKube FederatedCluster sites, data residency, tier overflow)")
    fed.add_argument("--tier", default="", help="this picker's own data-residency tier (local endpoints are in it)")
    fed.add_argument(
        "--federation-watch",
        action="store_true",
        help="follow FederatedClusters (federation.llmkube.dev/v1alpha1) as remote sites for overflow",
    )
    fed.add_argument(
        "--federation-allow-fail-open",
        action="store_true",
        help="start even though a FailOpen pool's fallback path would bypass a residency rule (logged loudly)",
    )
    _register_kubernetes(p)
    add_upstream_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    warnings = resolve_upstream_flags(args)
    # gRPC core's own lines (e.g. one per refused plaintext handshake at INFO) bypass Python logging and would break
    # JSON lines; errors only, unless the operator asks for more.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args.tls.enabled:
        # Before gRPC's first import: it reads its TLS cipher list then (epp.app.serve imports it).
        warnings += tls_policy(args.tls, native=args.extproc_transport == "native" and native_front_built())
    settings = serve_settings(args, warnings)
    from epp.app.serve import serve_from_settings

    return serve_from_settings(settings)
