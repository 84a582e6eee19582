"""Prefill/decode disaggregation through a real Envoy: upstream's P/D config (disagg-profile-handler with the
prefix-based decider), endpoints and roles from file-discovery, two prefill and two decode simulators whose
sidecar steps run over real HTTP. What each simulator did is read from its own counters (`GET /sim/pd`), not
from the picker."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epp.demo.processes import stop
from tests.e2e.conftest import Picker
from tests.support.envoy import envoy
from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.process, pytest.mark.timeout(240)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NON_CACHED_TOKENS = 256  # the decider's threshold (estimated tokens: 4 bytes each)

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {path: %s}
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: %d}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer},
            {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: queue-scorer},
            {pluginRef: max-score-picker}]
dataLayer:
  discovery: {pluginRef: file-discovery}
"""


@dataclass
class PdWorld:
    gateway: str
    prefill: list[str]
    decode: list[str]
    prefill_procs: list[Any]


def _sim_lines(log: Path) -> list[list[str]]:
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [p for p in lines if len(p) >= 4 and p[0].startswith("sim-")]


def _sim(servers: int, role: str) -> list[str]:
    return [sys.executable, "-m", "epp", "sim", "--servers", str(servers), "--base-port", "0", "--role", role]


@pytest.fixture(scope="module")
def world(envoy_available: None, e2e_tmp: Path) -> Iterator[PdWorld]:
    speed = ["--speed", "5", "--duration", "300"]
    logs = [e2e_tmp / "pd-prefill-0.log", e2e_tmp / "pd-prefill-1.log", e2e_tmp / "pd-decode.log"]
    with (
        running([*_sim(1, "prefill"), *speed], logs[0]) as p0,
        running([*_sim(1, "prefill"), *speed], logs[1]) as p1,
        running([*_sim(2, "decode"), *speed], logs[2]) as d,
    ):
        for log, proc, n in zip(logs, (p0, p1, d), (1, 1, 2), strict=True):
            wait_until(lambda log=log, n=n: len(_sim_lines(log)) == n, 60, f"epp sim ({log.name})", proc)
        prefill = [_sim_lines(logs[0])[0][1], _sim_lines(logs[1])[0][1]]
        decode = [line[1] for line in _sim_lines(logs[2])]
        entries = [
            {
                "name": f"{role}-{i}",
                "address": a.split(":")[0],
                "port": a.split(":")[1],
                "labels": {"llm-d.ai/role": role},
            }
            for role, addresses in (("prefill", prefill), ("decode", decode))
            for i, a in enumerate(addresses)
        ]
        endpoints = e2e_tmp / "pd-endpoints.json"
        endpoints.write_text(json.dumps({"endpoints": entries}))
        config = e2e_tmp / "pd-config.yaml"
        config.write_text(CONFIG % (endpoints, NON_CACHED_TOKENS))
        picker = Picker(grpc_port=free_port(), metrics_port=free_port())
        argv = serve_argv(
            picker.grpc_port, free_port(), picker.metrics_port, "--config-file", str(config), "--grace-period", "2"
        )
        with running(argv, e2e_tmp / "pd-picker.log") as proc:
            wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
            wait_until(lambda: _healthy(picker) == 4, 60, "first scrapes of the four simulators", proc)
            with envoy(e2e_tmp, picker.grpc_port, "FULL_DUPLEX_STREAMED") as port:
                yield PdWorld(f"http://127.0.0.1:{port}", prefill, decode, [p0, p1])


def _healthy(picker: Picker) -> int:
    """Endpoints whose data the picker's decisions use (a stage is only sent to such an endpoint)."""
    with urllib.request.urlopen(picker.url("/debug/pool"), timeout=5) as r:
        return sum(1 for e in json.loads(r.read())["endpoints"] if e["healthy"])


def _complete(world: PdWorld, prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        world.gateway + "/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        served_by = r.headers["x-sim-server"]
        answer = dict(json.loads(r.read()))
    answer["served_by"] = served_by
    return answer


def _counters(addresses: list[str]) -> dict[str, int]:
    total: dict[str, int] = {}
    for a in addresses:
        with urllib.request.urlopen(f"http://{a}/sim/pd", timeout=5) as r:
            for k, v in json.loads(r.read()).items():
                if isinstance(v, int):
                    total[k] = total.get(k, 0) + v
    return total


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def _long(tag: int) -> str:
    return f"document {tag}: " + f"uncached text number {tag} " * 120  # ≈ 800 estimated tokens, unique


def test_long_uncached_prompts_are_prefilled_on_a_prefill_server(world: PdWorld) -> None:
    before_p, before_d = _counters(world.prefill), _counters(world.decode)
    for i in range(4):
        assert _complete(world, _long(i))["usage"]["completion_tokens"] == 4
    served = _delta(before_p, _counters(world.prefill))
    decoded = _delta(before_d, _counters(world.decode))
    assert served["prefills_served"] == 4
    assert decoded["prefill_requests"] == 4 and decoded["remote_decodes"] == 4 and decoded["prefill_failures"] == 0


def test_short_and_cached_prompts_decode_directly(world: PdWorld) -> None:
    repeated = _long(100)
    first = _complete(world, repeated)  # uncached: P/D, and the decode server now holds the prefix
    before_p, before_d = _counters(world.prefill), _counters(world.decode)
    short = _complete(world, "hello there")
    again = _complete(world, repeated)
    assert _delta(before_p, _counters(world.prefill))["prefills_served"] == 0
    assert _delta(before_d, _counters(world.decode))["prefill_requests"] == 0
    assert again["served_by"] == first["served_by"] and short["served_by"].startswith("sim-")


def test_a_dead_prefill_server_means_decode_prefills_and_nothing_fails(world: PdWorld) -> None:
    stop(world.prefill_procs[0])
    stop(world.prefill_procs[1])
    before_d = _counters(world.decode)
    for i in range(4):
        assert _complete(world, _long(200 + i))["usage"]["completion_tokens"] == 4
    decoded = _delta(before_d, _counters(world.decode))
    assert decoded["remote_decodes"] == 0  # every one prefilled on its decode server
    assert decoded["prefill_requests"] == decoded["prefill_failures"]  # named before the scrapes saw it dead
