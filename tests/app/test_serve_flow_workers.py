"""`epp serve --workers 2` with the flowControl gate as a process: the picker has one queue, in the control
process, so a request queued on one worker is dispatched when the pool's one place frees on the other."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.extproc.envoy import BODY, body_msg, headers_msg
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until
from tests.support.tls import SELF_SIGNED_NAME, presented_certificate

pytestmark = pytest.mark.process

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
- type: queue-scorer
- type: max-score-picker
flowControl:
  defaultRequestTTL: 30s
  saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""


def _pool(metrics_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as r:
        pool: dict[str, Any] = json.loads(r.read())
    return pool


def _streams(metrics_port: int) -> list[int]:
    return [int(w["streams"]) for w in _pool(metrics_port)["workers"]]


class Stream:
    """One ext_proc stream on its own connection (so the kernel may give it to either worker): headers and body
    sent; `decided` waits for the response that carries the destination, skipping the hold responses."""

    def __init__(self, grpc_port: int, certificate: bytes) -> None:
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

        options = [("grpc.ssl_target_name_override", SELF_SIGNED_NAME), ("grpc.use_local_subchannel_pool", 1)]
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
        self.channel = grpc.secure_channel(f"127.0.0.1:{grpc_port}", credentials, options=options)
        self._outbox: queue.Queue[object] = queue.Queue()
        self._outbox.put(headers_msg())
        self._outbox.put(body_msg(BODY, True))
        self._responses = pb_grpc.ExternalProcessorStub(self.channel).Process(self._requests(), timeout=60)
        self._decided = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[object]:
        while (msg := self._outbox.get()) is not None:
            yield msg

    def _read(self) -> None:
        try:
            for response in self._responses:
                if response.dynamic_metadata.fields.get("envoy.lb") is not None:
                    self._decided.set()
        except grpc.RpcError:
            pass

    def decided(self, timeout: float) -> bool:
        return self._decided.wait(timeout)

    def close(self) -> None:
        self._outbox.put(None)
        self._responses.cancel()
        self.channel.close()


def test_a_request_queued_on_one_worker_is_dispatched_when_the_place_frees_on_the_other(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(CONFIG)
    grpc_port, metrics_port = free_port(), free_port()
    argv = serve_argv(
        grpc_port, free_port(), metrics_port, "--static-endpoints", "127.10.0.1:8000", "--workers", "2",
        "--config-file", str(tmp_path / "flow.yaml"),
    )  # fmt: skip
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        wait_until(lambda: all(w["serving"] for w in _pool(metrics_port)["workers"]), 60, "both workers", proc)
        certificate = presented_certificate(grpc_port)
        before = _streams(metrics_port)
        holder = Stream(grpc_port, certificate)  # takes the pool's one place
        assert holder.decided(20)
        after = _streams(metrics_port)
        first = next(i for i in range(2) if after[i] > before[i])
        queued = None
        tried = []
        for _ in range(40):  # new connections until one reaches the other worker
            before = after
            stream = Stream(grpc_port, certificate)
            started = sum(before) + 1
            wait_until(lambda n=started: sum(_streams(metrics_port)) >= n, 20, "stream started", proc)
            after = _streams(metrics_port)
            if after[1 - first] > before[1 - first]:
                queued = stream
                break
            tried.append(stream)
        assert queued is not None, "no connection reached the second worker"
        wait_until(lambda: _pool(metrics_port)["flowControl"]["queued"] == len(tried) + 1, 20, "queued", proc)
        assert not queued.decided(1.5)  # held on the other worker: the picker's one place is taken
        for stream in tried:  # those on the first worker leave the queue
            stream.close()
        holder.close()  # the place frees on the first worker
        assert queued.decided(20)  # dispatched to the second
        queued.close()
