"""The metrics port: bounded label cardinality, rendering off the serving loop, and `--metrics-endpoint-auth`."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from epp.app.http import build_http_app
from epp.app.metrics_auth import MetricsAuth
from epp.discovery.kubernetes.rest import KubeRest, load_api_client
from epp.discovery.kubernetes.review import AccessReviewer
from epp.extproc.stream import StreamSettings
from epp.observability.labels import (
    CLIENT_SERIES_BYTES,
    MAX_LABEL_BYTES,
    MODEL_LIMIT,
    OVERFLOW,
    SERIES_LINE_BYTES,
    SERIES_LINES,
)
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import DecidingStream
from tests.extproc.test_stream import body_msg, headers_msg, make_director
from tests.fakes.apiserver import FakeApiServer


def _request(stream: DecidingStream, model: str) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    stream.handle(headers_msg())
    stream.handle(body_msg(body, True))
    stream.close()


def test_ten_requests_with_8_mb_of_distinct_model_names_leave_metrics_and_memory_bounded() -> None:
    """Unbounded labels made 10 requests with 8 MB of distinct names cost 136 MB of RSS and a 160 MB /metrics.
    (Such names are now also refused as 400s by the request parser; the labels are bounded either way.)"""
    director = make_director()
    metrics = PickerMetrics(CollectorRegistry())
    settings = StreamSettings(max_body_bytes=1 << 21)
    _request(DecidingStream(director, metrics, lambda: 0.0, settings), "warm-up")
    before = len(generate_latest(metrics.registry))
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for i in range(10):
        _request(DecidingStream(director, metrics, lambda: 0.0, settings), f"{i}" + "m" * 800_000)  # 8 MB in all
    gc.collect()
    retained, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    text = generate_latest(metrics.registry)
    assert retained - base < 256 * 1024  # the names are not kept (8,000,000 bytes went through)
    assert len(text) - before < 64 * 1024  # one `other` series more, not 8 MB of labels
    assert b"mmmmmmmm" not in text
    assert max(len(line) for line in text.splitlines()) < 4 * MAX_LABEL_BYTES


def test_distinct_short_model_names_beyond_the_bound_share_the_other_label() -> None:
    director = make_director()
    metrics = PickerMetrics(CollectorRegistry())
    _request(DecidingStream(director, metrics, lambda: 0.0), "x" * (MAX_LABEL_BYTES + 1))  # too long: `other`
    for i in range(MODEL_LIMIT * 3):
        _request(DecidingStream(director, metrics, lambda: 0.0), f"model-{i}")
    models = {
        s.labels["model_name"] for f in metrics.registry.collect() if f.name == "llm_d_epp_request" for s in f.samples
    }
    # the first names, while the client series' estimated share of the page lasts; every later one is `other`
    admitted, spent = [], 0
    for i in range(MODEL_LIMIT * 3):
        cost = SERIES_LINES * (SERIES_LINE_BYTES + 2 * len(f"model-{i}"))
        if spent + cost > CLIENT_SERIES_BYTES:
            break
        admitted.append(f"model-{i}")
        spent += cost
    assert 0 < len(admitted) < MODEL_LIMIT
    assert models == {*admitted, OVERFLOW}
    other = {"model_name": OVERFLOW, "target_model_name": OVERFLOW, "fairness_id": "default-flow", "priority": "0"}
    assert metrics.registry.get_sample_value("llm_d_epp_request_total", other) == MODEL_LIMIT * 3 - len(admitted) + 1


class _ThreadRecorder:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("probe", "which thread renders", value=1.0)


async def test_metrics_are_rendered_off_the_serving_loop_from_a_frozen_copy() -> None:
    registry = CollectorRegistry()
    metrics = PickerMetrics(registry)
    recorder = _ThreadRecorder()
    registry.register(recorder)  # type: ignore[arg-type]
    metrics.request_done(None, "m1", "m1")
    app = build_http_app(registry, dict, lambda: True, [metrics])
    async with TestClient(TestServer(app)) as client:
        first = await (await client.get("/metrics")).text()
        metrics.request_done(None, "m1", "m1")  # after the freeze: the next scrape sees it
        second = await (await client.get("/metrics")).text()
    assert recorder.threads and threading.get_ident() not in recorder.threads
    assert 'epp_requests_total{code="OK",outcome="routed"} 1.0' in first
    assert 'epp_requests_total{code="OK",outcome="routed"} 2.0' in second


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    with FakeApiServer() as server:
        server.review_tokens = {
            "reader-token": ("system:serviceaccount:monitoring:prometheus", ["system:authenticated"]),
            "stranger-token": ("system:serviceaccount:default:other", []),
        }
        server.allow_non_resource = {("system:serviceaccount:monitoring:prometheus", "get", "/metrics")}
        yield server, server.write_kubeconfig(tmp_path / "kubeconfig")


async def test_metrics_and_debug_need_a_token_the_api_server_authorizes(api: tuple[FakeApiServer, Path]) -> None:
    server, kubeconfig = api
    auth = MetricsAuth(AccessReviewer(KubeRest(load_api_client(str(kubeconfig)))))
    app = build_http_app(CollectorRegistry(), dict, lambda: True, [], auth)
    async with TestClient(TestServer(app)) as client:

        async def status(path: str, token: str | None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return (await client.get(path, headers=headers)).status

        assert await status("/metrics", None) == 401
        assert await status("/metrics", "forged") == 401
        assert await status("/metrics", "stranger-token") == 403
        assert await status("/metrics", "reader-token") == 200
        assert await status("/debug/pool", None) == 401
        assert await status("/debug/pool", "reader-token") == 200
        assert await status("/healthz", None) == 200  # probes stay open
        reviews = [c for c in server.calls if c.path.endswith("reviews")]
        for _ in range(5):
            assert await status("/metrics", "reader-token") == 200
        assert [c for c in server.calls if c.path.endswith("reviews")] == reviews  # cached, not asked again
    kinds = {c.path.rsplit("/", 1)[1] for c in reviews}
    assert kinds == {"tokenreviews", "subjectaccessreviews"}


async def test_an_unreachable_api_server_answers_503_and_is_asked_again() -> None:
    class Down:
        calls = 0

        def review(self, token: str) -> tuple[int, str]:
            Down.calls += 1
            return 503, "cannot review the token"

    app = build_http_app(CollectorRegistry(), dict, lambda: True, [], MetricsAuth(Down()))
    async with TestClient(TestServer(app)) as client:
        for _ in range(2):
            assert (await client.get("/metrics", headers={"Authorization": "Bearer t"})).status == 503
    assert Down.calls == 2
    await asyncio.sleep(0)
