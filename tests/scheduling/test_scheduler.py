"""`build_scheduler`'s one result: every profile handler gives the same frozen `Scheduler`, whose fields say what
callers used to probe the handler for."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.config.decode import parse_config
from epp.errors import ConfigError
from epp.scheduling import Scheduler, build_scheduler
from epp.scheduling.disagg import DATA_PARALLEL_HEADER, PREFILLER_HEADER
from epp.scheduling.scheduler import RenderSettings
from tests.scheduling.tables import NOW, request, table_with
from tests.scheduling.test_disagg import ALWAYS, BASE, ROLE, pd_config


def _config(plugins: list[dict[str, Any]], refs: list[str], **extra: Any) -> Any:
    profile = {"name": "default", "plugins": [{"pluginRef": r} for r in refs]}
    return parse_config({**BASE, "plugins": plugins, "schedulingProfiles": [profile], **extra}, "s.yaml")


def test_the_result_is_frozen_and_the_same_type_for_every_handler() -> None:
    single = build_scheduler(None, seed=0)
    staged = build_scheduler(pd_config(ALWAYS), seed=0)
    ranks = build_scheduler(
        _config([{"type": "queue-scorer"}, {"type": "data-parallel-profile-handler"}], ["queue-scorer"]), seed=0
    )
    for scheduler in (single, staged, ranks):
        assert type(scheduler) is Scheduler
        with pytest.raises(dataclasses.FrozenInstanceError):
            scheduler.flow = None  # type: ignore[misc]
    assert single.routing is None and len(single.profiles) == 1
    assert staged.routing is not None and len(staged.profiles) == 2
    assert ranks.routing is not None and len(ranks.profiles) == 1
    assert single.description.startswith("profile 'default':")
    assert staged.description.startswith("decode profile 'decode':") and "prefill when" in staged.description


def test_routing_books_the_prefill_endpoint_and_names_it_for_the_sidecar() -> None:
    scheduler = build_scheduler(pd_config(ALWAYS), seed=0)
    table = table_with(
        [{"waiting": 0.0}] * 4, labels=[{ROLE: "prefill"}, {ROLE: "prefill"}, {ROLE: "decode"}, {ROLE: "decode"}]
    )
    snap = table.snapshot()
    pick = scheduler.handler.pick(snap, snap.slots, request("x" * 400), NOW)
    assert scheduler.routing is not None
    routing = scheduler.routing(pick, snap.addresses)
    assert routing is not None
    decode, (prefill, prefill_address) = int(pick[0]), routing.stages[0]
    assert routing.destination[0] == snap.addresses[decode] and prefill in (0, 1)
    assert dict(routing.headers) == {PREFILLER_HEADER: prefill_address}
    assert routing.booked == ""  # the destination is the decode endpoint's own address
    assert scheduler.routing((decode,), snap.addresses) is None  # the FailOpen fallback's pick goes where it is


def test_data_parallel_routing_sends_to_the_primary_port_and_books_the_rank() -> None:
    config = _config(
        [{"type": "queue-scorer"}, {"type": "data-parallel-profile-handler", "parameters": {"primaryPort": 8000}}],
        ["queue-scorer"],
    )
    scheduler = build_scheduler(config, seed=0)
    snap = table_with([{"waiting": 0.0}] * 2).snapshot()
    pick = scheduler.handler.pick(snap, snap.slots, request("hi"), NOW)
    assert scheduler.routing is not None
    routing = scheduler.routing(pick, snap.addresses)
    assert routing is not None
    rank = snap.addresses[int(pick[0])]
    assert routing.destination[0] == rank.rsplit(":", 1)[0] + ":8000" and routing.booked == rank
    assert dict(routing.headers) == {DATA_PARALLEL_HEADER: rank} and routing.stages == ()


def test_flow_control_and_admitters_are_decided_by_the_builder() -> None:
    plugins = [{"type": "queue-scorer"}, {"type": "probabilistic-admitter"}]
    gated = build_scheduler(_config(plugins, ["queue-scorer"], featureGates=["flowControl"]))
    plain = build_scheduler(_config(plugins, ["queue-scorer"]))
    assert gated.flow is not None and plain.flow is None
    assert [a.name for a in gated.admitters] == [a.name for a in plain.admitters] == ["probabilistic-admitter"]


def test_the_render_settings_are_the_vllm_token_producers() -> None:
    vllm = {"url": "http://127.0.0.1:8200", "timeout": "2s", "cacheSize": 64}
    producer = {"type": "token-producer", "parameters": {"modelName": "m", "vllm": vllm}}
    scheduler = build_scheduler(_config([producer, {"type": "queue-scorer"}], ["queue-scorer"]))
    assert scheduler.tokenizer == RenderSettings("http://127.0.0.1:8200", "m", 2.0, 30.0, 64)
    estimate = build_scheduler(_config([{"type": "token-producer"}, {"type": "queue-scorer"}], ["queue-scorer"]))
    assert estimate.tokenizer is None


def test_prefix_scorers_are_the_self_matching_ones_and_response_headers_only_where_written() -> None:
    scheduler = build_scheduler(None, seed=0)  # the built-in profile's prefix-cache-scorer matches by itself
    assert [s.name for s in scheduler.prefix_scorers] == ["prefix-cache-scorer"]
    assert scheduler.response_headers is None  # no plugin writes one
    # the producer form: its approximate producer keeps the index, learns the picks and is counted
    producers = build_scheduler(pd_config(ALWAYS), seed=0).prefix_scorers
    assert [p.type_name for p in producers] == ["approx-prefix-cache-producer"]
    session = build_scheduler(
        _config([{"type": "session-affinity-scorer"}], ["session-affinity-scorer"]), allow_experimental=True
    )
    assert session.response_headers is not None


def test_two_precise_producers_are_refused_by_the_builder() -> None:
    token = {"type": "token-producer", "parameters": {"modelName": "m", "vllm": {"url": "http://127.0.0.1:8200"}}}
    precise = [{"type": "precise-prefix-cache-producer", "name": n} for n in ("a", "b")]
    config = _config([token, *precise, {"type": "prefix-cache-scorer"}], ["prefix-cache-scorer"])
    with pytest.raises(ConfigError, match="one precise-prefix-cache-producer per config"):
        build_scheduler(config)


def test_the_concurrency_detector_leads_the_scrape_whatever_the_handler() -> None:
    """Eviction's grace follows the pool's detector; P/D's per-stage saturation wraps it without hiding it."""
    detector = {"flowControl": {"saturationDetector": {"pluginRef": "concurrency-detector"}}}
    plugins = [{"type": "concurrency-detector"}, {"type": "queue-scorer"}]
    assert build_scheduler(_config(plugins, ["queue-scorer"], **detector)).saturation_leads
    assert not build_scheduler(_config(plugins[1:], ["queue-scorer"])).saturation_leads
    roles = [{"type": "prefill-filter"}, {"type": "decode-filter"}, {"type": "always-disagg-pd-decider"}]
    handler = {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "always-disagg-pd-decider"}}}
    profiles = [
        {"name": name, "plugins": [{"pluginRef": role}, {"pluginRef": "queue-scorer"}]}
        for name, role in (("prefill", "prefill-filter"), ("decode", "decode-filter"))
    ]
    doc = {**BASE, "plugins": [*plugins, *roles, handler], "schedulingProfiles": profiles, **detector}
    staged = build_scheduler(parse_config(doc, "pd.yaml"))
    assert staged.routing is not None and staged.saturation_leads
