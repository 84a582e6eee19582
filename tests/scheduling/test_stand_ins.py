"""The upstream types that load without doing their job here: each one's safe behaviour, and upstream's parameter
checks (a config upstream refuses is refused here too)."""

from __future__ import annotations

import numpy as np
import pytest

from epp.config.decode import parse_config
from epp.errors import ConfigError
from epp.scheduling import build_scheduler
from epp.scheduling.framework import produced
from epp.scheduling.params import Params
from epp.scheduling.stand_ins import (
    NeverDecider,
    PassFilter,
    SilentProducer,
    ZeroScorer,
    attribute_filter,
    attribute_scorer,
    latency_scorer,
)
from tests.scheduling.tables import request, state, table_with

GPU_FILTER = {
    "attribute": "GPUUtilization",
    "producer": "dcgm-extractor",
    "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.9}},
}


def _state(n: int = 3):
    snap = table_with([{}] * n).snapshot()
    return state(snap, request("hello")), snap.slots


def test_pass_filters_keep_every_candidate_and_zero_scorers_score_nothing() -> None:
    st, slots = _state()
    assert PassFilter("topology-affinity-filter", "t").filter(st, slots).tolist() == slots.tolist()
    assert ZeroScorer("latency-scorer", "l").score(st, slots).tolist() == [0.0, 0.0, 0.0]
    assert NeverDecider("mm").disaggregate(st, 0) is False
    SilentProducer("predicted-latency-producer", "p").produce(st)
    assert produced(st, "p") is None


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ({}, 3),
        ({"onMissing": "Pass"}, 3),
        ({"onMissing": "Fail"}, 0),
        ({"onMissing": "Fail", "fallbackOnEmpty": True}, 3),
    ],
)
def test_an_attribute_filter_treats_every_endpoint_as_missing_the_attribute(extra, kept) -> None:
    """endpointattribute/filter.go: onMissing Pass (default) keeps an endpoint without the attribute, Fail drops
    it, and fallbackOnEmpty keeps all when none is left; here no endpoint has it."""
    st, slots = _state()
    plugin = attribute_filter("gpu", Params({**GPU_FILTER, **extra}, "cfg"))
    assert plugin.filter(st, slots).size == kept


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({**GPU_FILTER, "attribute": ""}, "attribute"),
        ({**GPU_FILTER, "onMissing": "Drop"}, "onMissing"),
        ({**GPU_FILTER, "algorithm": {"type": "linear"}}, "threshold"),
        ({**GPU_FILTER, "algorithm": {"type": "threshold"}}, "threshold: required"),
        ({**GPU_FILTER, "algorithm": {"type": "threshold", "threshold": {"operator": "Below"}}}, "operator"),
        ({**GPU_FILTER, "typo": 1}, "typo"),
    ],
)
def test_an_attribute_filter_refuses_what_upstream_refuses(params, words) -> None:
    with pytest.raises(ConfigError, match=words):
        attribute_filter("gpu", Params(params, "cfg"))


def test_the_scorers_check_upstreams_parameters() -> None:
    ok = {"algorithm": {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 0, "max": 1}}}}
    assert isinstance(attribute_scorer("s", Params(ok, "cfg")), ZeroScorer)
    with pytest.raises(ConfigError, match="min < max"):
        attribute_scorer(
            "s",
            Params({"algorithm": {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 1}}}}, "c"),
        )
    with pytest.raises(ConfigError, match="linear_lower_is_better"):
        attribute_scorer("s", Params({"algorithm": {"type": "log"}}, "cfg"))
    with pytest.raises(ConfigError, match="headroomSelectionStrategy"):
        latency_scorer("l", Params({"headroomSelectionStrategy": "random"}, "cfg"))


def test_a_profile_of_stand_ins_alone_still_picks_an_endpoint() -> None:
    """predicted-latency-slo's shape: a pass filter, a zero scorer and a weighted-random picker pick uniformly."""
    doc = {
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
    scheduler = build_scheduler(parse_config(doc, "cfg.yaml"), seed=1)
    snap = table_with([{}] * 4).snapshot()
    picks = {int(scheduler.handler.pick(snap, snap.slots, request(f"p{i}"), 1000.0)[0]) for i in range(40)}
    assert picks <= set(np.asarray(snap.slots).tolist()) and len(picks) > 1
