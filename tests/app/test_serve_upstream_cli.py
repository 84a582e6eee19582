"""`epp` started as upstream's image is: flags alone, JSON log lines, and the TLS knobs gRPC can enforce."""

from __future__ import annotations

import json
import socket
import ssl
from pathlib import Path

import pytest

from tests.support.procs import epp_argv, free_port, http_ok, running, wait_until

pytestmark = pytest.mark.process


def _handshake(port: int, **context: object) -> str:
    """The TLS version negotiated, or the error's class name when the server refuses."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    ciphers = context.pop("ciphers", None)
    if ciphers:
        ctx.set_ciphers(str(ciphers))
    for key, value in context.items():
        setattr(ctx, key, value)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
            return str(tls.version())
    except (ssl.SSLError, OSError) as exc:
        return type(exc).__name__


def _serve(tmp_path: Path, *flags: str) -> tuple[list[str], int, int]:
    grpc_port, metrics_port = free_port(), free_port()
    argv = epp_argv(
        "--static-endpoints", "127.10.0.1:8000", "--bind-address", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--grpc-health-port", str(free_port()), "--metrics-port", str(metrics_port), *flags,
    )  # fmt: skip
    return argv, grpc_port, metrics_port


def test_no_subcommand_and_zap_encoder_json_give_one_json_object_per_line(tmp_path: Path) -> None:
    argv, _, metrics_port = _serve(tmp_path, "--zap-encoder", "json", "--tracing=false", "--enable-pprof=false")
    log = tmp_path / "serve.log"
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp", proc)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert len(lines) >= 3  # the TLS line, "epp serving", "stopping", "stopped"
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert {"ts", "level", "logger", "msg"} <= set(record)
    assert any("ext_proc (TLS)" in r["msg"] for r in records)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # TLS 1.0/1.1 named on purpose: refused
def test_tls_1_2_suites_follow_the_flag_and_nothing_older_than_tls_1_2_is_served(tmp_path: Path) -> None:
    argv, grpc_port, metrics_port = _serve(tmp_path, "--tls-cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp", proc)
        tls12 = {"maximum_version": ssl.TLSVersion.TLSv1_2}
        assert _handshake(grpc_port, ciphers="ECDHE-RSA-AES128-GCM-SHA256", **tls12) == "TLSv1.2"
        assert _handshake(grpc_port, ciphers="ECDHE-RSA-AES256-GCM-SHA384", **tls12) != "TLSv1.2"  # not listed
        assert _handshake(grpc_port) == "TLSv1.3"  # TLS 1.3 suites are not configurable (as in Go)
        old = {"minimum_version": ssl.TLSVersion.TLSv1, "maximum_version": ssl.TLSVersion.TLSv1_1}
        assert _handshake(grpc_port, ciphers="ALL:@SECLEVEL=0", **old) not in ("TLSv1", "TLSv1.1")


def test_tls_min_version_13_on_grpc_is_accepted_with_one_warning_that_says_why(tmp_path: Path) -> None:
    argv, _, metrics_port = _serve(tmp_path, "--tls-min-version=VersionTLS13", "--extproc-transport=grpc")
    log = tmp_path / "serve.log"
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp", proc)
    warnings = [line for line in log.read_text().splitlines() if "--tls-min-version" in line]
    assert len(warnings) == 1 and "not enforced" in warnings[0] and "grpcio" in warnings[0]


def test_tls_min_version_13_is_enforced_by_the_native_front(tmp_path: Path) -> None:
    argv, grpc_port, metrics_port = _serve(tmp_path, "--tls-min-version=VersionTLS13", "--extproc-transport=native")
    log = tmp_path / "serve.log"
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "epp", proc)
        assert _handshake(grpc_port) == "TLSv1.3"
        assert _handshake(grpc_port, maximum_version=ssl.TLSVersion.TLSv1_2) != "TLSv1.2"
    assert not [line for line in log.read_text().splitlines() if "--tls-min-version" in line]
