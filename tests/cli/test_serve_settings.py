"""`epp serve`'s flags become one frozen ServeSettings (epp.cli.serve_settings), read once: upstream's flag names in,
typed values out, the cluster-dependent defaults resolved, and the same value handed to every serving worker."""

from __future__ import annotations

import argparse
import dataclasses
import pickle

import pytest

from epp.app.settings import ServeSettings
from epp.cli import serve as serve_cli
from epp.cli.serve_settings import serve_settings
from epp.cli.upstream_flags import UPSTREAM_DRAIN_TIMEOUT_S, resolve_upstream_flags
from epp.errors import ConfigError


def settings(*argv: str) -> ServeSettings:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", *argv])
    return serve_settings(args, resolve_upstream_flags(args))


def test_the_flags_land_in_typed_fields() -> None:
    s = settings(
        "--grpc-port", "9100", "--bind-address", "127.0.0.1", "--static-endpoints", "127.0.0.1:8000",
        "--max-body-bytes", "1024", "--grpc-max-recv-msg-size", "2MiB", "--tier", "eu", "--workers", "3",
        "--grace-period", "2s", "--refresh-metrics-interval", "100ms", "--disable-endpoint-subset-filter",
        "--secure-serving=false", "--zap-encoder", "json", "-v", "4",
    )  # fmt: skip
    assert (s.listen.bind_address, s.listen.grpc_port) == ("127.0.0.1", 9100)
    assert s.endpoints.static_endpoints == "127.0.0.1:8000" and s.endpoints.kubernetes is None
    assert (s.limits.max_body_bytes, s.limits.grpc_max_recv_msg_size) == (1024, 2 * 2**20)
    assert s.federation.tier == "eu" and not s.federation.watch
    assert (s.workers, s.grace_period_s, s.scrape.interval_s) == (3, 2.0, 0.1)
    assert not s.honour_subset and not s.tls.enabled
    assert (s.logging.encoder, s.logging.verbosity) == ("json", 4)


def test_the_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings().workers = 2  # type: ignore[misc]


def test_a_cluster_gets_upstreams_defaults_and_its_kubernetes_settings() -> None:
    cluster = settings("--pool-name", "pool", "--pool-namespace", "models")
    assert cluster.endpoints.kubernetes is not None and cluster.endpoints.kubernetes.pool_name == "pool"
    assert cluster.drain_timeout_s == UPSTREAM_DRAIN_TIMEOUT_S and cluster.metrics_auth
    alone = settings("--static-endpoints", "127.0.0.1:8000")
    assert alone.drain_timeout_s == 0.0 and not alone.metrics_auth


def test_flags_that_do_not_go_together_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="--max-buffered-body-bytes"):
        settings("--max-body-bytes", "2048", "--max-buffered-body-bytes", "1024")
    with pytest.raises(ConfigError, match="--endpoint-selector"):
        settings("--endpoint-selector", "app=vllm")  # standalone mode needs its target ports


def test_ignored_flags_become_startup_warnings() -> None:
    assert any("--zap-devel" in w for w in settings("--zap-devel").startup_warnings)


def test_a_worker_receives_the_same_settings() -> None:
    s = settings(
        "--endpoint-selector", "app in (vllm,sglang),tier!=cold", "--endpoint-target-ports", "8000",
        "--config-text", "apiVersion: x", "--allow-experimental-plugins",
    )  # fmt: skip
    assert pickle.loads(pickle.dumps(s)) == s
