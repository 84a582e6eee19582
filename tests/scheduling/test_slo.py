"""Upstream's SLO-aware types on the picker's own latency model: they load with upstream's parameters, fall back
while nothing is learned, and once the model has observations the SLO decides the tier, the score and admission."""

from __future__ import annotations

import numpy as np
import pytest

from epp.config.decode import parse_config
from epp.config.model import SaturationThresholds
from epp.datastore.observations import Observation, PickFeatures
from epp.errors import ConfigError
from epp.flowcontrol import QueuedRequest
from epp.scheduling import build_scheduler
from epp.scheduling.latency_model import LatencyModel
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext
from epp.scheduling.slo import HeadroomTierFilter, LatencyScorer, PredictedLatencyProducer, PredictiveSloAdmitter
from epp.scheduling.slo_factories import latency_producer, latency_scorer
from tests.scheduling.tables import request, state, table_with

DOC = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "predicted-latency-producer"},
        {"type": "slo-headroom-tier-filter"},
        {"type": "latency-scorer"},
        {"type": "weighted-random-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "predicted-latency-producer"},
                {"pluginRef": "slo-headroom-tier-filter"},
                {"pluginRef": "latency-scorer"},
                {"pluginRef": "weighted-random-picker"},
            ],
        }
    ],
}


def _ctx() -> BuildContext:
    return BuildContext(np.random.SeedSequence(1), SaturationThresholds())


def _teach(model: LatencyModel, slot: int, ttft_ms: float, n: int = 200, kv_tokens: float = float("nan")) -> None:
    for i in range(n):
        pick = PickFeatures(100, 100, float(i % 3), 2.0, 0.3, 1, 0.0, 0.0, 0, kv_tokens)
        model.observe(Observation(slot, f"127.10.0.{slot + 1}:8000", pick, ttft_ms / 1e3, 0.01, 10, True, 0.0, 0.0))


def test_the_profile_picks_before_anything_is_learned_and_learns_from_the_feed() -> None:
    scheduler = build_scheduler(parse_config(DOC, "cfg.yaml"), seed=1)
    snap = table_with([{}] * 4).snapshot()
    picks = {int(scheduler.handler.pick(snap, snap.slots, request(f"p{i}"), 1000.0)[0]) for i in range(40)}
    assert picks <= set(np.asarray(snap.slots).tolist()) and len(picks) > 1
    assert len(scheduler.learners) == 1 and scheduler.uncached is not None


def test_sidecar_parameters_are_accepted_and_noted_as_not_needed() -> None:
    ctx = _ctx()
    producer = latency_producer("p", Params({"contextTTL": "5m", "streamingMode": True}, "cfg"), ctx)
    assert isinstance(producer, PredictedLatencyProducer)
    assert any("not needed" in w and "contextTTL" in w for w in ctx.warnings)
    with pytest.raises(ConfigError, match="headroomSelectionStrategy"):
        latency_scorer("l", Params({"headroomSelectionStrategy": "random"}, "cfg"), ctx)


def test_headroom_tier_and_score_follow_the_predictions() -> None:
    model = LatencyModel()
    _teach(model, 0, 50.0)
    _teach(model, 1, 400.0)
    _teach(model, 2, 900.0)
    producer = PredictedLatencyProducer("p", model)
    snap = table_with([{"waiting": 1.0, "kv_usage": 0.3}] * 3).snapshot()
    st = state(snap, request("hello", slo_ttft_ms=500.0))
    producer.produce(st)
    kept = HeadroomTierFilter("f", "p", 0.0, 1).filter(st, snap.slots)
    assert kept.tolist() == [0, 1]
    least = LatencyScorer("l", "p", 0.8, 0.2, most=False).score(st, kept)
    most = LatencyScorer("l", "p", 0.8, 0.2, most=True).score(st, kept)
    assert least[1] > least[0] and most[0] > most[1]


def test_speed_tiers_leave_the_fast_class_to_the_objectives_only_it_can_meet() -> None:
    model = LatencyModel()
    fast_kv, slow_kv = 2000.0 * 16, 200.0 * 16  # KV capacity (blocks × block size): the hardware class
    _teach(model, 0, 40.0, kv_tokens=fast_kv)
    for slot in (1, 2):
        _teach(model, slot, 300.0, kv_tokens=slow_kv)
    producer = PredictedLatencyProducer("p", model)
    rows = [{"waiting": 1.0, "kv_usage": 0.3, "num_blocks": 2000.0, "block_size": 16.0}]
    rows += [{"waiting": 1.0, "kv_usage": 0.3, "num_blocks": 200.0, "block_size": 16.0}] * 2
    snap = table_with(rows).snapshot()
    tiers = HeadroomTierFilter("f", "p", 0.0, 1, speed_tiers=model)
    plain = HeadroomTierFilter("f", "p", 0.0, 1)
    loose = state(snap, request("hello", slo_ttft_ms=5000.0))  # every endpoint meets it
    producer.produce(loose)
    assert tiers.filter(loose, snap.slots).tolist() == [1, 2]  # the slow class serves it
    assert plain.filter(loose, snap.slots).tolist() == [0, 1, 2]  # upstream's filter: one tier
    tight = state(snap, request("hello", slo_ttft_ms=100.0))  # only the fast class meets it
    producer.produce(tight)
    assert tiers.filter(tight, snap.slots).tolist() == [0]
    unlearned = LatencyModel()
    _teach(unlearned, 0, 40.0, kv_tokens=fast_kv)
    _teach(unlearned, 1, 300.0)  # its class never reported: no speed known, nothing narrowed
    st = state(snap, request("hello", slo_ttft_ms=5000.0))
    PredictedLatencyProducer("q", unlearned).produce(st)
    assert HeadroomTierFilter("f", "q", 0.0, 1, speed_tiers=unlearned).filter(st, snap.slots).tolist() == [0, 1, 2]


def test_a_sheddable_request_no_endpoint_can_serve_in_time_is_refused() -> None:
    model = LatencyModel()
    for slot in range(2):
        _teach(model, slot, 800.0)
    admitter = PredictiveSloAdmitter("a", PredictedLatencyProducer("p", model))
    snap = table_with([{"waiting": 1.0, "running": 2.0, "kv_usage": 0.3}] * 2).snapshot()
    snap.inflight[:] = 1
    tight = QueuedRequest(None, priority=-1, received_at=10.0, slo_ttft_s=0.1)
    loose = QueuedRequest(None, priority=-1, received_at=10.0, slo_ttft_s=5.0)
    critical = QueuedRequest(None, priority=0, received_at=10.0, slo_ttft_s=0.1)
    assert not admitter.admit(tight, snap, snap.slots, 10.0, 0.5, 0.0)
    assert admitter.admit(loose, snap, snap.slots, 10.0, 0.5, 0.0)
    assert admitter.admit(critical, snap, snap.slots, 10.0, 0.5, 0.0)


def test_the_affinity_filter_reads_the_predicted_ttft_with_ttft_source_latency_predictor() -> None:
    from epp.scheduling.affinity_filter import PrefixCacheAffinityFilter
    from epp.scheduling.framework import PrefixMatch, publish

    model = LatencyModel()
    _teach(model, 0, 9000.0)  # the endpoint holding the prefix is predicted 9 s slow
    _teach(model, 1, 50.0)
    producer = PredictedLatencyProducer("p", model)
    snap = table_with([{"waiting": 1.0, "kv_usage": 0.3}] * 2).snapshot()
    st = state(snap, request("hello"))
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array([10.0, 0.0]), 10, 16))
    producer.produce(st)
    predicted = PrefixCacheAffinityFilter("f", max_penalty_ms=5000.0, latency_producer="p")
    throughput = PrefixCacheAffinityFilter("f", max_penalty_ms=5000.0)  # no tokens in flight: stays sticky
    assert predicted.filter(st, snap.slots).tolist() == [0, 1]  # the penalty is over 5 s: stickiness breaks
    assert throughput.filter(st, snap.slots).tolist() == [0]
