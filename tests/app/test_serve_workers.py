"""`epp serve --workers 2` as a process: ready while a worker serves, SIGTERM stops every worker and exits 0."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from tests.app.test_serve_lifecycle import health_status
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until
from tests.support.tls import presented_certificate

pytestmark = pytest.mark.process


def workers_of(metrics_port: int) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as r:
        workers: list[dict[str, object]] = json.loads(r.read())["workers"]
    return workers


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_workers_serve_then_all_stop_on_sigterm(tmp_path: Path) -> None:
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = serve_argv(grpc_port, health_port, metrics_port, "--static-endpoints", "127.10.0.1:8000", "--workers", "2")
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        wait_until(lambda: all(w["serving"] for w in workers_of(metrics_port)), 60, "both workers", proc)
        assert health_status(health_port, "readiness") == health_pb2.HealthCheckResponse.SERVING
        pids = [int(str(w["pid"])) for w in workers_of(metrics_port)]
        assert len(set(pids)) == 2 and proc.pid not in pids
        # One self-signed certificate on the port, whichever worker a connection reaches (each made its own
        # before: a client trusting the certificate it saw first failed on the other worker, one time in two).
        assert len({presented_certificate(grpc_port) for _ in range(12)}) == 1
        assert all(int(str(w["streams"])) == 0 for w in workers_of(metrics_port))  # handshakes only, no stream
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    wait_until(lambda: not any(alive(pid) for pid in pids), 30, "the workers' exit")
