"""Upstream's config through a real Envoy: endpoints and labels from `file-discovery`, a role filter, the parsers.

No endpoint flag: the picker reads its pool from the endpoints file its config names. Facts: llm-d-router
@ebab687927f5 `filter/bylabel/roles.go` (decode-filter keeps decode, prefill-decode, both), `parsers/anthropic`
(usage from `message_start` / `message_delta`), `parsers/passthrough/README.md` (any body, unread).
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import Picker
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, free_port, http_ok, running, serve_argv, wait_until

ROLES = ("decode", "prefill-decode", "both", "prefill")

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {path: %s}
- type: decode-filter
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: decode-filter}, {pluginRef: random-picker}]
dataLayer:
  discovery: {pluginRef: file-discovery}
"""


@pytest.fixture(scope="module")
def role_backends(e2e_tmp: Path) -> Iterator[dict[str, str]]:
    """One echo backend per role: address → role."""
    with echo_backends(len(ROLES), e2e_tmp / "role-backends.log") as addresses:
        yield dict(zip(addresses, ROLES, strict=True))


@pytest.fixture(scope="module")
def file_picker(e2e_tmp: Path, role_backends: dict[str, str]) -> Iterator[Picker]:
    entries = [
        {"name": f"pod-{role}", "address": a.split(":")[0], "port": a.split(":")[1], "labels": {"llm-d.ai/role": role}}
        for a, role in role_backends.items()
    ]
    endpoints = e2e_tmp / "endpoints.json"
    endpoints.write_text(json.dumps({"endpoints": entries}))
    config = e2e_tmp / "upstream-config.yaml"
    config.write_text(CONFIG % endpoints)
    picker = Picker(grpc_port=free_port(), metrics_port=free_port())
    argv = serve_argv(
        picker.grpc_port, free_port(), picker.metrics_port, "--config-file", str(config), "--grace-period", "2"
    )
    with running(argv, e2e_tmp / "file-picker.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        yield picker


@pytest.fixture(scope="module")
def file_gateway(envoy_available: None, e2e_tmp: Path, file_picker: Picker) -> Iterator[str]:
    with envoy(e2e_tmp, file_picker.grpc_port, "FULL_DUPLEX_STREAMED") as port:
        yield f"http://127.0.0.1:{port}"


def _metric(picker: Picker, name: str, model: str) -> float:
    with urllib.request.urlopen(picker.url("/metrics")) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_decode_filter_keeps_decode_prefill_decode_and_both_and_drops_prefill(
    file_gateway: str, role_backends: dict[str, str]
) -> None:
    served: Counter[str] = Counter()
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}).encode()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for _ in range(60):
            async with session.post(file_gateway + "/v1/chat/completions", data=body) as r:
                assert r.status == 200, await r.text()
                served[role_backends[r.headers["x-served-by"]]] += 1
    assert set(served) == {"decode", "prefill-decode", "both"}  # random over three: each is hit, prefill never


async def test_an_anthropic_messages_request_is_routed_and_its_streamed_usage_read(
    file_gateway: str, file_picker: Picker, role_backends: dict[str, str]
) -> None:
    body = {
        "model": "claude-e2e",
        "max_tokens": 32,
        "stream": True,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    }
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(file_gateway + "/v1/messages", json=body) as r,
    ):
        assert r.status == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert role_backends[r.headers["x-served-by"]] != "prefill"
        events = re.findall(r"^event: (\w+)$", (await r.read()).decode(), re.M)
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]

    def usage_recorded() -> bool:
        return _metric(file_picker, "llm_d_epp_request_output_tokens_sum", "claude-e2e") == 15

    wait_until(usage_recorded, 10, "the streamed usage in the picker's metrics")
    assert _metric(file_picker, "llm_d_epp_request_input_tokens_sum", "claude-e2e") == 25
    assert _metric(file_picker, "llm_d_epp_request_cached_tokens_sum", "claude-e2e") == 8


async def test_passthrough_parser_routes_a_non_json_body_untouched(
    file_gateway: str, role_backends: dict[str, str]
) -> None:
    payload = b"\x00\x01 not json at all \xff" * 100
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.post(
            file_gateway + "/v1/audio/upload", data=payload, headers={"content-type": "application/octet-stream"}
        ) as r,
    ):
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["body_bytes"] == len(payload) and answer["path"] == "/v1/audio/upload"
    assert role_backends[answer["served_by"]] != "prefill"
