"""`epp serve` with its scrape child: a killed child comes back, endpoints that fail show why, in the log and
`/debug/pool`.

Reproduction kept from the hardening probe: after SIGKILL of the scrape child nothing restarted it, every endpoint
went stale within 2 s while readiness stayed 200, and the child's log lines never reached the picker's log.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.process


class _Page:
    waiting = 3


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"vllm:num_requests_waiting {_Page.waiting}\nvllm:num_requests_running 1\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def debug_pool(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pool", timeout=5) as response:
        return dict(json.load(response))


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_a_killed_scrape_child_is_restarted_and_a_dead_endpoint_shows_its_reason(
    tmp_path: Path, metrics_server: ThreadingHTTPServer
) -> None:
    address = f"127.0.0.1:{metrics_server.server_address[1]}"
    metrics_port = free_port()
    argv = serve_argv(free_port(), free_port(), metrics_port, "--static-endpoints", address)
    log = tmp_path / "serve.log"
    with running(argv, log) as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)

        def endpoint() -> dict[str, Any]:
            return dict(debug_pool(metrics_port)["endpoints"][0])

        wait_until(lambda: endpoint()["metrics"]["waiting"] == 3, 60, "first scrape", proc)
        first = debug_pool(metrics_port)["scrapeProcess"]["pid"]
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        _Page.waiting = 8
        wait_until(lambda: endpoint()["metrics"]["waiting"] == 8, 30, "fresh data from a new child", proc)
        print(f"new child serving fresh data {time.monotonic() - killed_at:.2f}s after SIGKILL")
        report = debug_pool(metrics_port)
        assert report["scrapeProcess"]["pid"] != first and report["scrapeProcess"]["restarts"] == 1
        assert report["scrapeProcess"]["last_exit"] == "killed by SIGKILL"
        assert report["ready"] and http_ok(f"http://127.0.0.1:{metrics_port}/readyz")
        text = metrics_text(metrics_port)
        assert "epp_scrape_process_restarts_total 1.0" in text and "epp_scrape_process_up 1.0" in text

        metrics_server.shutdown()
        metrics_server.server_close()
        stopped_at = time.monotonic()
        wait_until(lambda: (endpoint()["scrape"] or {}).get("unusable") == "refused", 30, "unusable", proc)
        print(f"endpoint shown unusable (refused) in /debug/pool {time.monotonic() - stopped_at:.2f}s after it died")
        scrape = endpoint()["scrape"]
        assert "connect failed" in scrape["last_error"] and scrape["last_error_at"] is not None
        assert not endpoint()["healthy"]
        assert 'epp_scrape_unusable_endpoints{reason="refused"} 1.0' in metrics_text(metrics_port)
        wait_until(lambda: f"endpoint {address} unusable: refused" in log.read_text(), 10, "relayed log line", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    text = log.read_text()
    assert f"scrape process {first} died (killed by SIGKILL)" in text
    assert "Traceback" not in text
