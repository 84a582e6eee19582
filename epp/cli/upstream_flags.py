"""Upstream's command line for `epp serve`: its TLS, logging, diagnostics and serving flags, Go flag syntax, and one
warning line for each flag that is accepted but has no effect here.

Upstream's Helm chart renders its flags with no subcommand, as `--key=value`, bools as `--tracing=false`, and its
docs use Go's single-dash form too (`-v=4`). A picker swapped in unchanged must start with all of them. Every flag of
upstream's options file (`pkg/epp/server/options.go`, with its logging and zap flags) either works or is accepted
with one warning naming it as ignored (`resolve_upstream_flags`); `UPSTREAM_FLAGS` lists them all for the test that
checks acceptance.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from epp.app.tls import TLS_VERSIONS, TlsSettings, parse_cipher_suites
from epp.cli.flag_types import duration
from epp.observability.logs import level_of

UPSTREAM_DRAIN_TIMEOUT_S = 30.0  # upstream's --drain-timeout default, applied in cluster mode (see resolve)
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")

# Every flag of upstream's picker (options.go at its 2026 head, plus the deprecated ones older charts still pass).
UPSTREAM_FLAGS = (
    "grpc-port", "ha-enable-leader-election", "drain-timeout", "grpc-max-recv-msg-size", "grpc-max-send-msg-size",
    "pool-group", "pool-namespace", "pool-name", "endpoint-selector", "endpoint-target-ports",
    "disable-endpoint-subset-filter", "emit-endpoint-scores", "refresh-metrics-interval",
    "refresh-prometheus-metrics-interval", "metrics-staleness-threshold", "total-queued-requests-metric",
    "total-running-requests-metric", "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric",
    "model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
    "model-server-metrics-https-insecure-skip-verify", "v", "zap-devel", "zap-encoder", "zap-log-level",
    "zap-stacktrace-level", "zap-time-encoding", "tracing", "health-checking", "metrics-port", "grpc-health-port",
    "enable-pprof", "cert-path", "enable-cert-reload", "enable-grpc-stream-metrics", "secure-serving",
    "tls-min-version", "tls-cipher-suites", "metrics-endpoint-auth", "metrics-client-ca-file", "metrics-cert-dir",
    "config-file", "config-text", "allow-experimental-plugins",
)  # fmt: skip

_GO_TRUE = ("1", "t", "true", "yes", "on")
_GO_FALSE = ("0", "f", "false", "no", "off")


def go_bool(text: str) -> bool:
    """Go's boolean flag values (`--tracing=false`, `--secure-serving=0`)."""
    lowered = text.strip().lower()
    if lowered in _GO_TRUE:
        return True
    if lowered in _GO_FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?(?:[eE]\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_QUANTITY_SCALE = {
    None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def byte_quantity(text: str) -> int:
    """A size as upstream parses it: a Kubernetes quantity with an optional trailing B (`10MiB`, `25MB`, `4194304`)."""
    raw = text.strip()
    if len(raw) > 1 and raw[-1] in "Bb":
        raw = raw[:-1]
    match = _QUANTITY.match(raw)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 16MiB, 25MB, 4194304): {text!r}")
    value = int(float(match.group(1)) * _QUANTITY_SCALE[match.group(2)])
    if value >= 2**31:
        raise argparse.ArgumentTypeError(f"larger than gRPC's limit of 2 GiB: {text!r}")
    return value


def _bool_flag(group: Any, name: str, default: bool | None, help_text: str) -> None:
    """`--name`, `--name=true|false` (Go style); `--name false` also works, as nothing positional follows."""
    group.add_argument(name, type=go_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_text)


def add_upstream_flags(p: argparse.ArgumentParser) -> None:
    tls = p.add_argument_group("TLS on the ext_proc port (upstream's flags; the health port stays plaintext)")
    _bool_flag(tls, "--secure-serving", True, "serve TLS on the ext_proc port (default true; =false: plaintext)")
    tls.add_argument("--cert-path", default="", help="directory with tls.crt and tls.key (default: self-signed)")
    _bool_flag(tls, "--enable-cert-reload", False, "new connections get the --cert-path files as they change")
    tls.add_argument("--tls-min-version", default="", choices=TLS_VERSIONS, help="minimum TLS version (see docs)")
    tls.add_argument("--tls-cipher-suites", default="", help="TLS 1.2 cipher suites, Go names, comma separated")

    logs = p.add_argument_group("logging (upstream's -v and zap flags)")
    logs.add_argument(
        "-v", "--v", "--verbosity", dest="verbosity", type=int, default=2,
        help="verbosity as upstream: 0-1 warnings, 2-3 info (default 2), 4+ debug (per-request lines at debug)",
    )  # fmt: skip
    logs.add_argument("--zap-encoder", choices=("json", "console"), default="console", help="log line format")
    logs.add_argument("--zap-log-level", default="", help="debug, info, error, panic, or a verbosity (overrides -v)")
    logs.add_argument("--zap-time-encoding", choices=ZAP_TIME_ENCODINGS, default="", help="ts format of JSON lines")
    _bool_flag(logs, "--zap-devel", None, "accepted (zap's development preset); epp's defaults already apply")
    logs.add_argument("--zap-stacktrace-level", default=None, help="accepted; tracebacks go with their error lines")

    diag = p.add_argument_group("diagnostics (upstream's flags)")
    _bool_flag(diag, "--tracing", None, "OpenTelemetry traces (the tracing extra; upstream default true)")
    _bool_flag(
        diag, "--metrics-endpoint-auth", None, "/metrics needs an authorized bearer token (default: on in a cluster)"
    )
    diag.add_argument("--metrics-cert-dir", default=None, help="TLS for the metrics port (tls.crt, tls.key)")
    diag.add_argument("--metrics-client-ca-file", default=None, help="client CA for mTLS on the metrics port")
    _bool_flag(diag, "--enable-pprof", None, "serve /debug/stacks on the metrics port (Go's pprof profiles: none)")
    _bool_flag(diag, "--enable-grpc-stream-metrics", None, "ext_proc stream metrics")
    _bool_flag(diag, "--health-checking", None, "accepted; the gRPC health service is always on")

    srv = p.add_argument_group("serving (upstream's flags)")
    srv.add_argument(
        "--drain-timeout", type=duration, default=None,
        help="after SIGTERM: readiness off, ext_proc keeps accepting this long, then --grace-period for open streams "
        f"(default {UPSTREAM_DRAIN_TIMEOUT_S:.0f}s in a cluster as upstream, 0s otherwise)",
    )  # fmt: skip
    srv.add_argument("--grpc-max-recv-msg-size", type=byte_quantity, default=None, help="gRPC receive limit")
    srv.add_argument("--grpc-max-send-msg-size", type=byte_quantity, default=None, help="gRPC send limit")
    srv.add_argument("--config-text", default=None, help="an EndpointPickerConfig given inline (YAML)")
    _bool_flag(srv, "--disable-endpoint-subset-filter", False, "ignore the gateway's endpoint subset hint")
    _bool_flag(srv, "--allow-experimental-plugins", False, "accept plugin types upstream marks Alpha in the config")
    _bool_flag(
        srv, "--emit-endpoint-scores", False,
        "write every scored endpoint's weighted score into envoy.lb metadata (x-gateway-destination-endpoint-scores)",
    )  # fmt: skip
    _bool_flag(
        srv, "--enable-test-endpoint-selection", False,
        "honour the conformance header test-epp-endpoint-selection (tests only; never in production)",
    )  # fmt: skip

    old = p.add_argument_group("deprecated upstream flags (accepted, ignored with a warning)")
    for name in (
        "--refresh-prometheus-metrics-interval", "--total-queued-requests-metric", "--total-running-requests-metric",
        "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric",
        "--model-server-metrics-scheme", "--model-server-metrics-path", "--model-server-metrics-port",
    ):  # fmt: skip
        old.add_argument(name, default=None, help=argparse.SUPPRESS)
    _bool_flag(old, "--model-server-metrics-https-insecure-skip-verify", None, argparse.SUPPRESS)


def go_style_argv(argv: Sequence[str], long_options: set[str]) -> list[str]:
    """Go's single-dash long flags (`-pool-name x`, `-v=4`) as argparse's `--pool-name x`, `--v=4`.

    Only tokens naming a known long option change, so a value such as `-1` or a selector is never rewritten.
    """
    out: list[str] = []
    for token in argv:
        if token == "--":
            out.extend(argv[len(out) :])
            break
        if token.startswith("-") and not token.startswith("--") and len(token) > 2:
            name = token.split("=", 1)[0]
            if "-" + name in long_options:
                token = "-" + token
        out.append(token)
    return out


_IGNORED = {
    "zap_devel": "--zap-devel",
    "zap_stacktrace_level": "--zap-stacktrace-level",
    "metrics_cert_dir": "--metrics-cert-dir",
    "metrics_client_ca_file": "--metrics-client-ca-file",
    "refresh_prometheus_metrics_interval": "--refresh-prometheus-metrics-interval",
    "total_queued_requests_metric": "--total-queued-requests-metric",
    "total_running_requests_metric": "--total-running-requests-metric",
    "kv_cache_usage_percentage_metric": "--kv-cache-usage-percentage-metric",
    "lora_info_metric": "--lora-info-metric",
    "cache_info_metric": "--cache-info-metric",
    "model_server_metrics_scheme": "--model-server-metrics-scheme",
    "model_server_metrics_path": "--model-server-metrics-path",
    "model_server_metrics_port": "--model-server-metrics-port",
    "model_server_metrics_https_insecure_skip_verify": "--model-server-metrics-https-insecure-skip-verify",
}
_WHY = {
    "--zap-devel": "epp's log defaults apply",
    "--zap-stacktrace-level": "Python tracebacks are logged with the error they belong to",
    "--metrics-cert-dir": "the metrics port serves plaintext",
    "--metrics-client-ca-file": "the metrics port serves plaintext",
    "--refresh-prometheus-metrics-interval": "pool gauges are computed at each /metrics scrape",
}
_ENGINE_WHY = "model-server metric names come from the engine mappings or a core-metrics-extractor config"


def resolve_upstream_flags(args: argparse.Namespace) -> list[str]:
    """Fill the cluster-dependent defaults and the TLS settings into `args`; return one warning per flag that was
    given but has no effect here (upstream's names, so an operator sees which of the chart's flags did nothing)."""
    cluster = bool(
        getattr(args, "pool_name", "") or getattr(args, "pool_selector", "") or getattr(args, "endpoint_selector", "")
    )
    if args.metrics_endpoint_auth is None:
        args.metrics_endpoint_auth = cluster  # upstream's default (true) where there is an API server to ask
    if args.drain_timeout is None:
        args.drain_timeout = UPSTREAM_DRAIN_TIMEOUT_S if cluster else 0.0
    if args.config_text is not None and args.config_file:
        raise_config("both --config-file and --config-text are set; give one")
    args.tls = TlsSettings(
        enabled=bool(args.secure_serving),
        cert_dir=args.cert_path,
        reload=bool(args.enable_cert_reload),
        min_version=args.tls_min_version,
        cipher_suites=parse_cipher_suites(args.tls_cipher_suites),
    )
    try:
        level_of(args.verbosity, args.zap_log_level)
    except ValueError as exc:
        raise_config(str(exc))
    warnings: list[str] = []
    if not args.tls.enabled and (args.cert_path or args.tls_min_version or args.tls_cipher_suites):
        warnings.append("--secure-serving=false: --cert-path and the other TLS flags are ignored (plaintext)")
    for attr, flag in _IGNORED.items():
        if getattr(args, attr, None) is not None:
            warnings.append(f"{flag}: accepted and ignored ({_WHY.get(flag, _ENGINE_WHY)})")
    if args.health_checking is False:
        warnings.append("--health-checking=false: accepted and ignored (the gRPC health service is always on)")
    if args.enable_grpc_stream_metrics is False:
        warnings.append("--enable-grpc-stream-metrics=false: accepted and ignored (stream metrics are always on)")
    if args.enable_test_endpoint_selection:
        warnings.append(
            "--enable-test-endpoint-selection: clients choose their endpoint with test-epp-endpoint-selection "
            "(conformance tests only; never in production)"
        )
    return warnings


def raise_config(message: str) -> None:
    from epp.errors import ConfigError

    raise ConfigError(message)
