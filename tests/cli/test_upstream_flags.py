"""Upstream's command line starts `epp` unchanged: no subcommand, every upstream flag accepted (working, or ignored
with one warning naming it), Go flag syntax, one version, and JSON log lines."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import subprocess
import sys

import pytest

import epp
from epp.cli import build_parser, upstream_argv
from epp.cli.upstream_flags import UPSTREAM_FLAGS, byte_quantity, resolve_upstream_flags
from epp.errors import ConfigError
from epp.observability.logs import JsonLineFormatter, level_of

# One value each flag of upstream's options file would take (bools in the chart's `--flag=value` form).
SAMPLE = {
    "grpc-port": "9002", "ha-enable-leader-election": "true", "drain-timeout": "30s",
    "grpc-max-recv-msg-size": "10MiB", "grpc-max-send-msg-size": "25MB", "pool-group": "inference.networking.k8s.io",
    "pool-namespace": "ai", "pool-name": "vllm-pool", "endpoint-selector": "", "endpoint-target-ports": "",
    "disable-endpoint-subset-filter": "false", "emit-endpoint-scores": "true", "refresh-metrics-interval": "50ms",
    "refresh-prometheus-metrics-interval": "5s", "metrics-staleness-threshold": "2s",
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc", "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info", "model-server-metrics-scheme": "http",
    "model-server-metrics-path": "/metrics", "model-server-metrics-port": "8000",
    "model-server-metrics-https-insecure-skip-verify": "true", "v": "2", "zap-devel": "true", "zap-encoder": "json",
    "zap-log-level": "info", "zap-stacktrace-level": "error", "zap-time-encoding": "iso8601", "tracing": "false",
    "health-checking": "true", "metrics-port": "9090", "grpc-health-port": "9003", "enable-pprof": "true",
    "cert-path": "", "enable-cert-reload": "false", "enable-grpc-stream-metrics": "true", "secure-serving": "true",
    "tls-min-version": "VersionTLS12", "tls-cipher-suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "metrics-endpoint-auth": "false", "metrics-client-ca-file": "/etc/ca.pem", "metrics-cert-dir": "/etc/metrics",
    "config-file": "/config/default-plugins.yaml", "config-text": "", "allow-experimental-plugins": "true",
}  # fmt: skip
IGNORED = (
    "refresh-prometheus-metrics-interval", "total-queued-requests-metric",
    "total-running-requests-metric", "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric",
    "model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
    "model-server-metrics-https-insecure-skip-verify", "zap-devel", "zap-stacktrace-level",
    "metrics-client-ca-file", "metrics-cert-dir",
)  # fmt: skip

# What upstream's chart renders (config/charts/routerlib/templates/_deployment.yaml): one replica, then HA.
CHART_ARGS = [
    "--pool-name", "vllm-pool", "--pool-namespace", "ai", "--pool-group", "inference.networking.k8s.io",
    "--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml", "--grpc-health-port", "9003",
    "--tracing=false", "--metrics-endpoint-auth=false",
]  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    return parser.parse_args(upstream_argv(parser, argv))


def test_the_list_covers_every_sample_and_nothing_more() -> None:
    assert sorted(SAMPLE) == sorted(UPSTREAM_FLAGS)


@pytest.mark.parametrize("flag", UPSTREAM_FLAGS)
def test_every_upstream_flag_is_accepted_without_a_subcommand(flag: str) -> None:
    args = parse([f"--{flag}={SAMPLE[flag]}"])
    assert args.command == "serve"
    warnings = resolve_upstream_flags(args)
    named = [w for w in warnings if w.startswith(f"--{flag}")]
    if flag in IGNORED:
        assert len(named) == 1 and "ignored" in named[0], warnings
    else:
        assert not [w for w in named if "ignored" in w], warnings


def test_emit_endpoint_scores_is_off_by_default_and_on_when_given() -> None:
    from epp.cli.serve_settings import serve_settings

    def emit(argv: list[str]) -> bool:
        args = parse(argv)
        return serve_settings(args, resolve_upstream_flags(args)).emit_scores

    assert (emit([]), emit(["--emit-endpoint-scores"]), emit(["--emit-endpoint-scores=false"])) == (False, True, False)


def test_the_charts_args_start_serve_with_their_meaning() -> None:
    for argv in (CHART_ARGS, [*CHART_ARGS, "--ha-enable-leader-election"]):
        args = parse(argv)
        resolve_upstream_flags(args)
        assert (args.command, args.pool_name, args.pool_namespace, args.zap_encoder) == (
            "serve",
            "vllm-pool",
            "ai",
            "json",
        )
        assert args.tracing is False and args.metrics_endpoint_auth is False
        assert args.tls.enabled  # TLS by default, as upstream
        assert args.drain_timeout == 30.0  # upstream's default drain in a cluster
    assert parse([*CHART_ARGS, "--ha-enable-leader-election"]).ha_enable_leader_election is True


def test_go_flag_syntax() -> None:
    args = parse(["-pool-name=p", "-v=4", "--secure-serving=false", "-zap-encoder", "json", "--enable-cert-reload"])
    assert (args.pool_name, args.verbosity, args.secure_serving, args.zap_encoder) == ("p", 4, False, "json")
    assert args.enable_cert_reload is True
    assert parse(["--v", "3"]).verbosity == 3
    assert parse(["-v", "5"]).verbosity == 5
    assert parse(["serve", "--secure-serving=0"]).secure_serving is False


def test_cluster_defaults_follow_upstream_and_cluster_free_runs_stay_quiet() -> None:
    cluster = parse(["--pool-name", "p"])
    resolve_upstream_flags(cluster)
    assert cluster.metrics_endpoint_auth is True and cluster.drain_timeout == 30.0
    local = parse(["--static-endpoints", "127.0.0.1:8000"])
    resolve_upstream_flags(local)
    assert local.metrics_endpoint_auth is False and local.drain_timeout == 0.0


def test_bad_values_are_refused() -> None:
    with pytest.raises(ConfigError, match="config-text"):
        resolve_upstream_flags(parse(["--config-file", "a.yaml", "--config-text", "x: 1"]))
    with pytest.raises(ConfigError, match="tls-cipher-suites"):
        resolve_upstream_flags(parse(["--tls-cipher-suites", "TLS_NOT_A_SUITE"]))
    with pytest.raises(ConfigError, match="zap-log-level"):
        resolve_upstream_flags(parse(["--zap-log-level", "loud"]))
    for argv in (["--tls-min-version", "TLS1.2"], ["--secure-serving=maybe"], ["--grpc-max-recv-msg-size", "lots"]):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == 2


def test_sizes_parse_as_upstream_quantities() -> None:
    assert byte_quantity("10MiB") == 10 << 20
    assert byte_quantity("25MB") == 25_000_000
    assert byte_quantity("4194304") == 4 << 20


def test_verbosity_maps_as_upstreams_levels() -> None:
    assert [level_of(v) for v in (0, 1, 2, 3, 4, 5)] == [logging.WARNING] * 2 + [logging.INFO] * 2 + [logging.DEBUG] * 2
    assert level_of(2, "debug") == logging.DEBUG
    assert level_of(4, "error") == logging.ERROR


def test_json_log_lines_carry_zaps_keys_and_the_records_fields() -> None:
    record = logging.LogRecord("epp.tls", logging.WARNING, __file__, 1, "swapped %s", ("cert",), None)
    record.pool = "vllm-pool"
    line = json.loads(JsonLineFormatter().format(record))
    assert list(line)[:4] == ["ts", "level", "logger", "msg"]
    assert (line["level"], line["logger"], line["msg"], line["pool"]) == (
        "warn",
        "epp.tls",
        "swapped cert",
        "vllm-pool",
    )
    assert line["ts"].endswith("Z")


@pytest.mark.process
def test_version_has_one_source() -> None:
    out = subprocess.run([sys.executable, "-m", "epp", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"epp {epp.__version__}"
    assert importlib.metadata.version("epp-picker") == epp.__version__
