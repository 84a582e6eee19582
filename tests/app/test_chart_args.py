"""`epp` started with exactly the args upstream's Helm chart renders (tests/data/chart-args, sources in
tests/data/SOURCES.md) against the fake API server: SERVING on `inference-extension`, JSON log lines, and `/metrics`
refused without a token and served with one the API server authorizes (the chart leaves metrics auth on).

After the chart's args come only what a shared test machine needs: the kubeconfig of the fake API server, free
loopback ports and a config file path that exists here (given again, the last value wins, as with Go's flags).
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import ROOT
from tests.discovery.k8s_objects import pod, pool
from tests.fakes.apiserver import FakeApiServer
from tests.support.procs import epp_argv, free_port, running, wait_until

pytestmark = pytest.mark.process

CHART_ARGS = ROOT / "tests/data/chart-args"
READER = "system:serviceaccount:monitoring:prometheus"


def health(port: int, service: str) -> int:
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status)
    except grpc.RpcError:
        return -1


def metrics_status(port: int, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize("variant", ["single-replica", "ha"])
def test_the_charts_args_start_a_serving_picker_with_json_logs_and_metrics_auth(tmp_path: Path, variant: str) -> None:
    chart_args = (CHART_ARGS / f"{variant}.args").read_text().split()
    config = tmp_path / "default-plugins.yaml"
    config.write_text((ROOT / "tests/data/epp-configs/gie-integration-default-config.yaml").read_text())
    with FakeApiServer() as api:
        api.apply(pool("vllm-pool"))
        api.apply(pod("vllm-0", ip="127.10.0.7"))
        api.review_tokens = {"reader-token": (READER, []), "other-token": ("system:anonymous-ish", [])}
        api.allow_non_resource = {(READER, "get", "/metrics")}
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
        local = ["--kubeconfig", str(kubeconfig), "--config-file", str(config), "--bind-address", "127.0.0.1"]
        local += ["--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port)]
        local += ["--metrics-port", str(metrics_port), "--drain-timeout=0s"]
        log = tmp_path / "epp.log"
        with running(epp_argv(*chart_args, *local), log, env={"NAMESPACE": "default", "POD_NAME": "epp-0"}) as proc:
            serving = health_pb2.HealthCheckResponse.SERVING
            wait_until(lambda: health(health_port, "inference-extension") == serving, 60, "epp", proc)
            assert metrics_status(metrics_port, None) == 401
            assert metrics_status(metrics_port, "forged") == 401
            assert metrics_status(metrics_port, "other-token") == 403
            assert metrics_status(metrics_port, "reader-token") == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]  # every line is one JSON object (--zap-encoder json)
    assert all(isinstance(r, dict) for r in records)
