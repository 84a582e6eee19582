"""Pickers for the Kubernetes scenario tests: a real `epp serve` process read through `/debug/pool`, and the
KubernetesSource alone on its own event loop thread (for the many short steps of the stateful test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.discovery.kubernetes.source import KubernetesSource
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until


class ServedPicker:
    """`epp serve` against the fake API server; every assertion goes through its HTTP and health ports."""

    def __init__(self, proc: subprocess.Popen[bytes], metrics_port: int, health_port: int, log: Path) -> None:
        self.proc = proc
        self.metrics_port = metrics_port
        self.health_port = health_port
        self.log = log

    def report(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/debug/pool", timeout=2) as response:
            return dict(json.load(response))

    def endpoints(self) -> set[str]:
        return {e["address"] for e in self.report()["endpoints"]}

    def readiness(self) -> bool:
        """The gRPC health service's answer for `readiness`, as the kubelet's probe would ask it."""
        with grpc.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answer = stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


@contextlib.contextmanager
def served_picker(kubeconfig: Path, log: Path, *flags: str) -> Iterator[ServedPicker]:
    metrics, health, grpc_port = free_port(), free_port(), free_port()
    # These scenarios read /debug/pool; metrics-port authorization has its own tests (tests/app/test_metrics_port.py)
    argv = serve_argv(
        grpc_port, health, metrics, "--kubeconfig", str(kubeconfig), "--grace-period", "0.5",
        "--metrics-endpoint-auth=false", *flags,
    )  # fmt: skip
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics}/healthz"), 60, "epp serve", proc)
        picker = ServedPicker(proc, metrics, health, log)
        # With serving workers (the default where the machine has cores for them) readiness also waits for one
        # of them to serve: the scenarios start once every worker does, as a one-process picker would be.
        wait_until(lambda: all(w["serving"] for w in picker.report().get("workers", ())), 60, "the workers", proc)
        yield picker


def eventually(check: Callable[[], bool], within_s: float, what: Callable[[], str]) -> None:
    """Poll `check` until true; fail with `what()` (the state seen last) after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s}s: {what()}")
        time.sleep(0.02)


class ThreadedSource:
    """A KubernetesSource running on its own loop in a thread, so synchronous tests (hypothesis) can drive it."""

    def __init__(self, settings: KubernetesSettings) -> None:
        self.table = EndpointTable()
        self.objectives = ObjectiveStore()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="k8s-source", daemon=True)
        self._thread.start()
        self.source = KubernetesSource(self.table, self.objectives, settings)
        self.call(self.source.start)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def endpoints(self) -> set[str]:
        return set(self.call(self.table.addresses))

    def close(self) -> None:
        self.call(self.source.stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
