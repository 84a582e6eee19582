"""Upstream plugin types that load here but cannot do their job: each has one safe, documented behaviour.

A config that upstream runs must load here too (its own tests say which ones must). Some of its plugin types need
what this picker does not have: GPU utilisation from DCGM, topology labels, multimodal
request parsing, CEL expressions. Refusing such a config would stop a working upstream deployment from moving over,
so each of these types loads, reads and checks upstream's parameters, logs one warning naming the plugin (its
`LIMITATION`, through the registry) and behaves as upstream does when the data it needs is missing:

| type | here |
|---|---|
| endpoint-attribute-filter | no endpoint has the attribute: `onMissing` decides (Pass: keep all; Fail: drop all) |
| topology-affinity-filter | keeps every candidate |
| endpoint-attribute-scorer, topology-affinity-scorer, mm-embeddings-cache-scorer | score 0 |
| mm-embeddings-cache-producer | publishes nothing |
| always-disagg-multimodal-decider | never (no request is recognised as multimodal) |
| request-attribute-reporter | reports nothing (its CEL expressions are not evaluated) |
| dcgm-data-source, dcgm-extractor, topology-extractor | nothing is collected |

`disagg-headers-handler` and its older name `prefill-header-handler` (deprecated upstream) need no stand-in for
their job: the disaggregating profile handler sets the P/D headers itself (`epp.scheduling.disagg`); they are
`RequestHook`s with nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.datastore.table import IntArray
from epp.scheduling.framework import CycleState, Linear, LinearScorer
from epp.scheduling.params import Params

_ZERO = Linear(None, 0.0, 0.0)


class PassFilter:
    """Keeps every candidate (the filter's data is never collected here)."""

    def __init__(self, type_name: str, name: str) -> None:
        self.type_name = type_name
        self.name = name

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        return candidates


class AttributeFilter(PassFilter):
    """`endpoint-attribute-filter` with no attribute collected: every endpoint is missing it, so upstream's
    `onMissing` decides for all of them (Pass: keep; Fail: drop, and `fallbackOnEmpty` then keeps them all)."""

    def __init__(self, name: str, keep_missing: bool, fallback_on_empty: bool) -> None:
        super().__init__("endpoint-attribute-filter", name)
        self.keep_all = keep_missing or fallback_on_empty

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        return candidates if self.keep_all else candidates[:0]


class ZeroScorer(LinearScorer):
    """Scores 0 for every candidate: the other scorers of the profile decide (alone: every endpoint ties)."""

    def __init__(self, type_name: str, name: str) -> None:
        self.type_name = type_name
        super().__init__(name)

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        return _ZERO


class SilentProducer:
    """Publishes nothing: a consumer of its data finds none and falls back as it does for a missing producer."""

    ORDER = 50

    def __init__(self, type_name: str, name: str) -> None:
        self.type_name = type_name
        self.name = name

    def produce(self, state: CycleState) -> None:
        return None


class NeverDecider:
    """`always-disagg-multimodal-decider`: disaggregates multimodal requests, and none is recognised here."""

    type_name = "always-disagg-multimodal-decider"

    def __init__(self, name: str) -> None:
        self.name = name

    def disaggregate(self, state: CycleState, decode_slot: int) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class RequestHook:
    """A plugin upstream runs around a request (pre-request, response) that has nothing to do here."""

    type_name: str
    name: str


@dataclass(frozen=True, slots=True)
class Uncollected:
    """A data-layer source or extractor whose data is not collected here (GPU utilisation, topology labels)."""

    type_name: str
    name: str


# -- factories: upstream's parameters, read and checked as upstream does --------------------------------------------

_OPERATORS = ("LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Equal", "NotEqual")


def attribute_filter(name: str, params: Params) -> AttributeFilter:
    attribute = params.text("attribute", "")
    params.text("producer", "")
    on_missing = params.text("onMissing", "Pass") or "Pass"
    fallback = params.flag("fallbackOnEmpty", False)
    algorithm = Params(params.section("algorithm"), f"{params.where}: algorithm")
    kind = algorithm.text("type", "")
    has_threshold = algorithm.present("threshold")
    threshold = Params(algorithm.section("threshold"), f"{params.where}: algorithm.threshold")
    operator = threshold.text("operator", "")
    threshold.number("value", 0.0)
    threshold.finish()
    algorithm.finish()
    params.finish()
    if not attribute:
        raise params.error("attribute", "required: the endpoint attribute to test")
    if on_missing not in ("Pass", "Fail"):
        raise params.error("onMissing", f"expected Pass or Fail, got {on_missing!r}")
    if kind != "threshold":
        raise params.error("algorithm", f"type must be 'threshold', got {kind!r}")
    if not has_threshold:
        raise params.error("algorithm", "threshold: required when type is 'threshold'")
    if operator not in _OPERATORS:
        raise params.error("algorithm", f"threshold.operator must be one of {', '.join(_OPERATORS)}, got {operator!r}")
    return AttributeFilter(name, on_missing == "Pass", fallback)


def attribute_scorer(name: str, params: Params) -> ZeroScorer:
    params.text("attributeKey", "")
    params.text("producer", "")
    algorithm = Params(params.section("algorithm"), f"{params.where}: algorithm")
    kind = algorithm.text("type", "")
    normalization = Params(algorithm.section("normalization"), f"{params.where}: algorithm.normalization")
    fixed = Params(normalization.section("fixedRange"), f"{params.where}: normalization.fixedRange")
    given = fixed.present("min") or fixed.present("max")
    low, high = fixed.number("min", 0.0), fixed.number("max", 0.0)
    fixed.finish()
    Params(normalization.section("adaptiveRange"), f"{params.where}: normalization.adaptiveRange").finish()
    normalization.finish()
    algorithm.finish()
    params.finish()
    if kind not in ("linear_lower_is_better", "linear_higher_is_better"):
        raise params.error("algorithm", f"type must be linear_lower_is_better or linear_higher_is_better, got {kind!r}")
    if given and not low < high:
        raise params.error("algorithm", f"normalization.fixedRange needs min < max, got min {low}, max {high}")
    return ZeroScorer("endpoint-attribute-scorer", name)


def topology_filter(name: str, params: Params) -> PassFilter:
    params.text("minAffinity", "host")
    params.text("topologyProducerName", "")
    params.finish()
    return PassFilter("topology-affinity-filter", name)


def topology_scorer(name: str, params: Params) -> ZeroScorer:
    params.text("topologyProducerName", "")
    params.finish()
    return ZeroScorer("topology-affinity-scorer", name)


def mm_producer(name: str, params: Params) -> SilentProducer:
    params.integer("cacheSizeInMBPerServer", 0, minimum=0)
    params.ignore("cacheSizeInMB")  # upstream's deploy/config spelling, which upstream's decoder ignores
    params.finish()
    return SilentProducer("mm-embeddings-cache-producer", name)


def mm_scorer(name: str, params: Params) -> ZeroScorer:
    params.text("producerName", "")
    params.finish()
    return ZeroScorer("mm-embeddings-cache-scorer", name)


def multimodal_decider(name: str, params: Params) -> NeverDecider:
    params.finish()
    return NeverDecider(name)


def headers_handler(name: str, params: Params) -> RequestHook:
    params.text("prefillProfile", "prefill")
    params.text("encodeProfile", "encode")
    params.finish()
    return RequestHook("disagg-headers-handler", name)  # upstream's type for both of its names


def attribute_reporter(name: str, params: Params) -> RequestHook:
    for i, item in enumerate(params.records("attributes")):
        entry = Params(item, f"{params.where}: attributes[{i}]")
        key = Params(entry.section("key"), f"{params.where}: attributes[{i}].key")
        if not key.text("namespace", "") or not key.text("name", ""):
            raise entry.error("key", "namespace and name are required")
        key.finish()
        if not entry.text("expression", "").strip():
            raise entry.error("expression", "required: the CEL expression to report")
        entry.text("condition", "")
        entry.finish()
    params.finish()
    return RequestHook("request-attribute-reporter", name)


def dcgm_source(name: str, params: Params) -> Uncollected:
    scheme = params.text("scheme", "http")
    params.text("path", "/metrics")
    port = params.integer("port", 9400, minimum=1)
    params.flag("insecureSkipVerify", True)
    params.flag("useNodeAddress", False)
    params.duration("interval", 0.0)
    params.finish()
    if scheme not in ("http", "https"):
        raise params.error("scheme", f"expected http or https, got {scheme!r}")
    if port > 65535:
        raise params.error("port", f"must be at most 65535, got {port}")
    return Uncollected("dcgm-data-source", name)


def dcgm_extractor(name: str, params: Params) -> Uncollected:
    params.finish()
    return Uncollected("dcgm-extractor", name)


def topology_extractor(name: str, params: Params) -> Uncollected:
    for label in ("hostname", "rack", "zone", "region"):
        params.text(label, "")
    params.finish()
    return Uncollected("topology-extractor", name)
