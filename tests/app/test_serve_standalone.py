"""`epp serve` without a cluster from upstream's `file-discovery` config and an objectives file: no endpoint flag."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.process

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {path: %s, watchFile: true}
- type: metrics-data-source
- type: core-metrics-extractor
- type: decode-filter
- type: random-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: random-picker}]
dataLayer:
  injectDefaults: false
  sources: [{pluginRef: metrics-data-source, extractors: [{pluginRef: core-metrics-extractor}]}]
  discovery: {pluginRef: file-discovery}
"""

ENDPOINTS = """
endpoints:
- {name: d0, address: "127.10.0.1", port: "8000", labels: {llm-d.ai/role: decode}}
- {name: bad, address: "not-an-ip", port: "8000"}
"""

OBJECTIVES = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1}
"""


def _pool(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pool") as response:
        return json.load(response)


def test_file_discovery_serves_without_a_cluster_and_follows_the_file(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(ENDPOINTS)
    config = tmp_path / "epp.yaml"
    config.write_text(CONFIG % endpoints)
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    metrics_port = free_port()
    argv = serve_argv(
        free_port(), free_port(), metrics_port, "--config-file", str(config), "--objectives-file", str(objectives)
    )
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        (only,) = _pool(metrics_port)["endpoints"]
        assert only["address"] == "127.10.0.1:8000" and only["labels"] == {"llm-d.ai/role": "decode"}
        endpoints.write_text(ENDPOINTS.replace("127.10.0.1", "127.10.0.2"))
        deadline = time.monotonic() + 15
        while [e["address"] for e in _pool(metrics_port)["endpoints"]] != ["127.10.0.2:8000"]:
            assert time.monotonic() < deadline, "the watched file's change never reached the pool"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    log = (tmp_path / "serve.log").read_text()
    assert "endpoint 'bad': invalid IPv4 address 'not-an-ip'; entry skipped" in log
    assert "--objectives-file" in log and "1 objectives" in log


def test_a_bad_endpoints_file_fails_the_start(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text("endpoints: [")
    config = tmp_path / "epp.yaml"
    config.write_text(CONFIG % endpoints)
    argv = serve_argv(free_port(), free_port(), free_port(), "--config-file", str(config))
    with running(argv, tmp_path / "serve.log") as proc:
        assert proc.wait(20) == 2
    assert "not valid YAML or JSON" in (tmp_path / "serve.log").read_text()


def test_file_discovery_and_static_endpoints_are_exclusive(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(ENDPOINTS)
    config = tmp_path / "epp.yaml"
    config.write_text(CONFIG % endpoints)
    argv = serve_argv(
        free_port(), free_port(), free_port(), "--config-file", str(config), "--static-endpoints", "127.10.0.9:80"
    )
    with running(argv, tmp_path / "serve.log") as proc:
        assert proc.wait(20) == 2
    assert "exclusive" in (tmp_path / "serve.log").read_text()
