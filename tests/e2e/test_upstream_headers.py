"""Upstream's request and refusal headers through a real Envoy (over TLS, the picker's default): a sheddable
objective named by `x-llm-d-inference-objective` while the pool is saturated gets 429 with
`x-llm-d-request-dropped-reason: rejected-saturated`; the older `x-gateway-*` name is read as an alias."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import Backends, start_picker
from tests.e2e.test_routing import CHAT, chat, post
from tests.support.envoy import envoy
from tests.support.procs import http_ok, running, wait_until

OBJECTIVES = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: pool}}
"""


@pytest.fixture(scope="module")
def saturated_gateway(e2e_tmp: Path, backends: Backends, envoy_available: None) -> Iterator[str]:
    """Every endpoint's data is stale (one scrape an hour, stale after 1 ms): saturated for admission. (The echo
    backends' JSON answer to /metrics is a page with no model-server metrics, not a failed scrape.)"""
    objectives = e2e_tmp / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    argv, picker = start_picker(
        e2e_tmp, ",".join(backends.pool), "--objectives-file", str(objectives),
        "--refresh-metrics-interval", "1h", "--metrics-staleness-threshold", "1ms",
    )  # fmt: skip
    with running(argv, e2e_tmp / "picker-objectives.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        with envoy(e2e_tmp, picker.grpc_port, "FULL_DUPLEX_STREAMED") as port:
            yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("header", ["x-llm-d-inference-objective", "x-gateway-inference-objective"])
async def test_a_sheddable_objective_on_a_saturated_pool_gets_429_with_the_dropped_reason(
    saturated_gateway: str, header: str
) -> None:
    async with aiohttp.ClientSession() as session:
        status, headers, body = await post(session, saturated_gateway + CHAT, chat(), {header: "batch"})
        assert status == 429, body
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert body.startswith(b"inference error: ResourceExhausted")
        status, headers, _ = await post(session, saturated_gateway + CHAT, chat())  # no objective: priority 0
        assert status == 200 and "x-llm-d-request-dropped-reason" not in headers
