"""The three configs with a `flowControl:` section in upstream's deploy samples load and route requests
(tests/data/epp-configs/llmd-router-*, sources in tests/data/SOURCES.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epp.app.config_file import load_config
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director import Director
from epp.director.flow import FlowGate
from epp.errors import EppError
from epp.flowcontrol import FlowController
from epp.flowcontrol.admission import ProbabilisticAdmitter
from epp.flowcontrol.gauge import PoolGauge
from epp.flowcontrol.policies import SoftReflectiveCeiling
from epp.requests import parse_request
from epp.scheduling import build_scheduler

DATA = Path(__file__).parents[1] / "data" / "epp-configs"
NOW = 100.0


def _table(waiting: float) -> EndpointTable:
    table = EndpointTable()
    for i in range(2):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000", labels={}, pod_name=f"p{i}"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, kv_usage=0.0), now=NOW)
    return table


def _request(objective: str | None = None) -> object:
    headers = {":path": "/v1/completions", "content-type": "application/json"}
    if objective:
        headers["x-llm-d-inference-objective"] = objective
    return parse_request("r", "/v1/completions", headers, b'{"model": "m", "prompt": "hi"}')


async def _route(name: str, waiting: float, objective: str | None = None) -> str:
    config = load_config(DATA / name, allow_experimental=True, warn=False)
    scheduler = build_scheduler(config, allow_experimental=True)
    table = _table(waiting)
    objectives = ObjectiveStore()
    objectives.put_objective("sheddable", -1)
    flow = None
    if scheduler.flow is not None:
        gauge = PoolGauge(scheduler.saturation, scheduler.freshness)
        flow = FlowGate(FlowController(scheduler.flow), table, gauge, lambda: NOW, objectives)
        flow.start()
    director = Director(table, scheduler, clock=lambda: NOW, objectives=objectives, flow=flow)
    request = _request(objective)
    try:
        if flow is not None:
            await asyncio.wait_for(flow.admit(request.headers, 0), 5)  # type: ignore[attr-defined]
        decision = director.decide(request)  # type: ignore[arg-type]
        if flow is not None:
            flow.decided()
        return decision.addresses[0]
    finally:
        if flow is not None:
            await flow.shutdown(0)


async def test_sim_program_aware_config_queues_with_program_aware_fairness() -> None:
    config = load_config(DATA / "llmd-router-sim-program-aware-config.yaml", warn=False)
    settings = build_scheduler(config).flow
    assert settings is not None and settings.spec.default_band.fairness_policy_ref == "program-aware-fairness"
    assert (await _route("llmd-router-sim-program-aware-config.yaml", waiting=0)).startswith("127.10.0.")


async def test_soft_reflective_ceiling_config_needs_experimental_plugins_and_routes() -> None:
    with pytest.raises(Exception, match="Alpha"):
        load_config(DATA / "llmd-router-soft-reflective-ceiling-epp-config.yaml", warn=False)
    config = load_config(
        DATA / "llmd-router-soft-reflective-ceiling-epp-config.yaml", allow_experimental=True, warn=False
    )
    settings = build_scheduler(config, allow_experimental=True).flow
    assert settings is not None and isinstance(settings.usage_limit, SoftReflectiveCeiling)
    assert (await _route("llmd-router-soft-reflective-ceiling-epp-config.yaml", waiting=1)).startswith("127.10.0.")


async def test_probabilistic_admitter_config_sheds_sheddable_traffic_with_the_gate_off() -> None:
    config = load_config(DATA / "llmd-router-probabilistic-admitter-epp-config.yaml", warn=False)
    scheduler = build_scheduler(config)
    assert scheduler.flow is None  # no featureGates: the section only names the detector
    assert any(isinstance(a, ProbabilisticAdmitter) for a in scheduler.admitters)
    assert (
        await _route("llmd-router-probabilistic-admitter-epp-config.yaml", waiting=0, objective="sheddable")
    ).startswith("127.10.0.")
    with pytest.raises(EppError) as shed:  # admitter saturation 1.0 (waiting 5 of 5): shed with certainty
        await _route("llmd-router-probabilistic-admitter-epp-config.yaml", waiting=5, objective="sheddable")
    assert shed.value.code.http_status == 429 and shed.value.dropped_reason == "rejected-saturated"
    assert (await _route("llmd-router-probabilistic-admitter-epp-config.yaml", waiting=5)).startswith("127.10.0.")
