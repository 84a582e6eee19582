"""Envoy's STREAMED request body mode, through a real Envoy: chat requests are routed, not refused.

Envoy waits for the headers answer before it streams the body in this mode, so the picker makes a pool-level pick
on the headers and answers every body chunk with a pass-through (reproduction 12 of the hardening probe: every
chat request got 400 in this mode).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.app.worker import METRICS_S
from epp.gateway.testbed import gateway_bootstrap
from tests.e2e.conftest import Backends, Picker, metrics_when, settled_value
from tests.e2e.test_routing import CHAT, chat, post
from tests.support.envoy import run_envoy
from tests.support.procs import free_port


def _ext_proc_configs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if str(node.get("@type", "")).endswith("ext_proc.v3.ExternalProcessor"):
            yield node
        for value in node.values():
            yield from _ext_proc_configs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _ext_proc_configs(value)


@pytest.fixture(scope="module", params=[False, True], ids=["headers-first", "early-body"])
def streamed_gateway(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, picker: Picker
) -> Iterator[tuple[str, bool]]:
    """STREAMED; with early body, Envoy streams the chunks without waiting for the headers answer, and the
    picker holds its answers until it has decided on the whole body."""
    listen, admin = free_port(), free_port()
    config = gateway_bootstrap(listen, admin, picker.grpc_port, "STREAMED", "")
    for ext_proc in _ext_proc_configs(config):
        ext_proc["send_body_without_waiting_for_header_response"] = request.param
    with run_envoy(e2e_tmp, config, f"streamed-{listen}"):
        yield f"http://127.0.0.1:{listen}", request.param


def _routed_for_model(text: str, model: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "inference_objective_request_total" and sample.labels.get("model_name") == model
    )


async def test_chat_requests_in_streamed_mode_are_routed_with_their_body_intact(
    streamed_gateway: tuple[str, bool], backends: Backends, picker: Picker
) -> None:
    url, early_body = streamed_gateway
    big = chat("x" * 300_000)  # several body chunks, each answered on its own
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        before = await settled_value(session, picker, lambda text: _routed_for_model(text, "m1"))
        for body in (chat("hello"), big):
            status, headers, raw = await post(session, url + CHAT, body)
            assert status == 200, raw
            answer = json.loads(raw)
            assert answer["destination_header"] == answer["served_by"] == headers["x-served-by"]
            assert answer["served_by"] in backends.pool
            assert answer["body_bytes"] == len(json.dumps(body).encode())
        # With early body the decision read the model; headers first, it was a pool-level pick.
        expected = before + (2 if early_body else 0)
        text = await metrics_when(session, picker, lambda text: _routed_for_model(text, "m1") >= expected)
        if not early_body:  # nothing more may come: the workers' next expositions are in
            await asyncio.sleep(2 * METRICS_S)
            text = await metrics_when(session, picker, lambda text: True)
        assert _routed_for_model(text, "m1") == expected
