"""The upstream types that load without doing their job here: each one's safe behaviour, and upstream's parameter
checks (a config upstream refuses is refused here too)."""

from __future__ import annotations

import pytest

from epp.errors import ConfigError
from epp.scheduling.framework import produced
from epp.scheduling.params import Params
from epp.scheduling.stand_ins import (
    NeverDecider,
    PassFilter,
    SilentProducer,
    ZeroScorer,
    attribute_filter,
    attribute_scorer,
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
    assert ZeroScorer("topology-affinity-scorer", "l").score(st, slots).tolist() == [0.0, 0.0, 0.0]
    assert NeverDecider("mm").disaggregate(st, 0) is False
    SilentProducer("mm-embeddings-cache-producer", "p").produce(st)
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
