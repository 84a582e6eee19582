"""`epp serve` as a process: health services, readiness, and a graceful stop on SIGTERM."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until
from tests.support.tls import picker_channel

pytestmark = pytest.mark.process


def health_status(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)


def test_serve_reports_health_and_pool_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p1}\n"
        "spec: {selector: {matchLabels: {app: m}}, targetPorts: [{number: 8000}],"
        " endpointPickerRef: {name: epp, failureMode: FailOpen}}\n"
    )
    argv = serve_argv(
        grpc_port, health_port, metrics_port, "--pool-file", str(pool), "--static-endpoints", "127.10.0.1,127.10.0.2"
    )
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("liveness", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor"):
            assert health_status(health_port, service) == serving
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool") as response:
            report = json.load(response)
        assert report["pool"]["failureMode"] == "FailOpen"
        assert [e["address"] for e in report["endpoints"]] == ["127.10.0.1:8000", "127.10.0.2:8000"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert "stopped" in (tmp_path / "serve.log").read_text()


def test_sigterm_lets_an_open_stream_finish_then_exits_0(tmp_path: Path) -> None:
    """Readiness goes off at once, but a stream already open still gets its decision within the grace period."""
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from tests.extproc.test_stream import BODY, body_msg, destination, headers_msg

    grpc_port, metrics_port = free_port(), free_port()
    argv = serve_argv(
        grpc_port, free_port(), metrics_port, "--static-endpoints", "127.10.0.1:8000", "--grace-period", "10"
    )
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        with picker_channel(grpc_port) as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            sent: list[object] = [headers_msg()]
            import queue
            import threading

            outbox: queue.Queue[object] = queue.Queue()
            outbox.put(sent[0])
            release = threading.Event()

            def requests():  # type: ignore[no-untyped-def]
                yield outbox.get()
                release.wait(10)
                yield body_msg(BODY, True)

            responses = stub.Process(requests(), timeout=15)
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            wait_until(
                lambda: "epp_open_streams 1.0" in urllib.request.urlopen(metrics_url).read().decode(),
                10,
                "stream open",
                proc,
            )
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: not http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 10, "readiness off", proc)
            release.set()
            first = next(responses)
            assert destination(first) == "127.10.0.1:8000"  # type: ignore[arg-type]
        assert proc.wait(20) == 0


def test_a_buffered_body_above_grpcs_default_limit_is_decided_not_dropped(tmp_path: Path) -> None:
    """BUFFERED sends the whole body in one message: up to --max-body-bytes it must reach the picker."""
    import json as json_module

    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from tests.extproc.test_stream import body_msg, destination, headers_msg

    body = json_module.dumps({"model": "m1", "prompt": "x" * (5 << 20)}).encode()  # 5 MiB: over gRPC's 4 MiB
    grpc_port, metrics_port = free_port(), free_port()
    argv = serve_argv(
        grpc_port, free_port(), metrics_port, "--static-endpoints", "127.10.0.1:8000", "--max-body-bytes", str(8 << 20)
    )
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        with picker_channel(grpc_port) as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            buffered = processing_mode_pb2.ProcessingMode.BUFFERED
            messages = [headers_msg(mode=buffered, path="/v1/completions"), body_msg(body, True)]
            answers = list(stub.Process(iter(messages), timeout=15))
    assert answers[0].WhichOneof("response") == "request_headers"
    assert destination(answers[1]) == "127.10.0.1:8000"  # type: ignore[arg-type]
