"""`epp serve`: the picker itself, with upstream's flags and ports."""

from __future__ import annotations

import argparse
from typing import Any


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


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the endpoint picker (ext_proc gRPC server)")
    p.add_argument("--grpc-port", type=_port, default=9002, help="ext_proc gRPC port (default 9002)")
    p.add_argument("--grpc-health-port", type=_port, default=9003, help="gRPC health port (default 9003)")
    p.add_argument("--metrics-port", type=_port, default=9090, help="Prometheus /metrics and /debug (default 9090)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address the servers listen on (default 0.0.0.0)")
    p.add_argument("--config-file", help="EndpointPickerConfig YAML (default: the built-in profile)")
    p.add_argument("--static-endpoints", help="cluster-free mode: comma list of ip:port endpoints")
    p.add_argument("--pool-file", help="cluster-free mode: an InferencePool v1 YAML (its failureMode is honoured)")
    p.add_argument(
        "--max-body-bytes",
        type=_positive_bytes,
        default=16 * 1024 * 1024,
        help="largest request body accepted; larger gets 413 (default 16 MiB)",
    )
    p.add_argument(
        "--grace-period",
        type=float,
        default=10.0,
        help="seconds open streams get to finish after SIGTERM (default 10)",
    )
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
    p.add_argument("-v", "--verbosity", type=int, default=1, help="log level: 0 warnings, 1 info, 2+ debug")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from epp.app.serve import serve_from_args

    return serve_from_args(args)
