"""Plugin types by name: each a factory from (name, parameters, build context) to a plugin object.

Registration is explicit (`register_builtins`), never a side effect of importing a module, so the set of types a
binary accepts is written in one place and a test can build a registry with only the types it wants.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from epp.config.model import SaturationThresholds
from epp.datastore import Freshness
from epp.scheduling import affinity, filters, flow_plugins, pickers, prefix, saturation, scorers, test_selection
from epp.scheduling.params import Params


class Kind(enum.Enum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    PROFILE_HANDLER = "profile handler"
    PARSER = "parser"
    DATA_LAYER = "data-layer plugin"
    DISCOVERY = "endpoint-discovery plugin"
    FLOW_CONTROL = "flow-control policy"
    ADMITTER = "admitter"


class Stability(enum.Enum):
    """Upstream's stability levels: an ALPHA type loads only with `--allow-experimental-plugins`, as upstream."""

    ALPHA = "alpha"
    BETA = "beta"


@dataclass(slots=True)
class BuildContext:
    """What factories may use: a seed source so every randomised plugin gets its own reproducible stream, the
    config's saturation thresholds, and the pool's one rule for usable data."""

    seed_sequence: np.random.SeedSequence
    saturation: SaturationThresholds
    freshness: Freshness = field(default_factory=Freshness)

    def next_seed(self) -> int:
        return int(self.seed_sequence.spawn(1)[0].generate_state(1)[0])


Factory = Callable[[str, Params, BuildContext], object]


@dataclass(frozen=True, slots=True)
class PluginType:
    type_name: str
    kind: Kind
    factory: Factory
    summary: str
    stability: Stability = Stability.BETA
    replaced_by: str | None = None  # deprecated upstream in favour of this type: loading it logs a warning


class Registry:
    def __init__(self) -> None:
        self._types: dict[str, PluginType] = {}

    def register(
        self,
        type_name: str,
        kind: Kind,
        factory: Factory,
        summary: str,
        *,
        stability: Stability = Stability.BETA,
        replaced_by: str | None = None,
    ) -> None:
        if type_name in self._types:
            raise ValueError(f"plugin type {type_name!r} registered twice")
        self._types[type_name] = PluginType(type_name, kind, factory, summary, stability, replaced_by)

    def get(self, type_name: str) -> PluginType | None:
        return self._types.get(type_name)

    def names(self) -> list[str]:
        return sorted(self._types)


# -- factories ----------------------------------------------------------------------------------------------------


def _no_params(cls: Callable[[str], object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return cls(name)

    return factory


def _prefix(name: str, params: Params, ctx: BuildContext) -> object:
    scorer = prefix.PrefixCacheScorer(
        name,
        block_size=params.integer("blockSize", 64, minimum=1),
        max_blocks=params.integer("maxPrefixBlocksToMatch", 256, minimum=1),
        lru_capacity=params.integer("lruCapacityPerServer", 31250, minimum=2),
        auto_tune=params.flag("autoTune", True),
    )
    params.finish()
    return scorer


def _session(name: str, params: Params, ctx: BuildContext) -> object:
    scorer = affinity.SessionAffinityScorer(name, max_sessions=params.integer("maxSessions", 100_000, minimum=1))
    params.finish()
    return scorer


def _picker(cls: Callable[..., object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        k = params.integer("maxNumOfEndpoints", 1, minimum=1)
        params.finish()
        return cls(name, max_endpoints=k, seed=ctx.next_seed())

    return factory


def _saturation_filter(name: str, params: Params, ctx: BuildContext) -> object:
    base = ctx.saturation  # the config's saturationDetector block, overridable per filter
    pool = ctx.freshness.staleness_s
    staleness = params.duration("metricsStalenessThreshold", pool)
    if staleness != pool:  # the pool has one: the scorers, the detector and /debug/pool read the same data
        raise params.error(
            "metricsStalenessThreshold",
            f"{staleness:g}s differs from the pool's staleness threshold ({pool:g}s); set it once, in "
            "saturationDetector.metricsStalenessThreshold or with --metrics-staleness-threshold",
        )
    thresholds = SaturationThresholds(
        queue_depth=params.number("queueDepthThreshold", base.queue_depth, minimum=0),
        kv_util=params.number("kvCacheUtilThreshold", base.kv_util, minimum=0, maximum=1),
        headroom=params.number("headroom", base.headroom, minimum=0, maximum=1),
    )
    params.finish()
    return saturation.SaturationFilter(name, thresholds)


def _label_filter(name: str, params: Params, ctx: BuildContext) -> object:
    wanted = params.mapping("matchLabels")
    params.finish()
    if not wanted:
        raise params.error("matchLabels", "required: the labels an endpoint must carry")
    return filters.LabelFilter("label-filter", name, filters.match_labels(wanted))


def _by_label(name: str, params: Params, ctx: BuildContext) -> object:
    label = params.text("label", "")
    valid = params.strings("validValues")
    allow_missing = params.flag("allowsNoLabel", False)
    params.finish()
    if not label:
        raise params.error("label", "required: the label to test")
    return filters.LabelFilter("by-label", name, filters.label_in(label, valid, allow_missing))


def _header_testing_filter(name: str, params: Params, ctx: BuildContext) -> object:
    params.finish()
    return test_selection.HeaderBasedTestingFilter(name)


@dataclass(frozen=True, slots=True)
class FileDiscoveryPlugin:
    """Upstream's `file-discovery`: endpoints from a YAML/JSON file instead of a cluster (`dataLayer.discovery`).

    Only the parameters here: reading and watching the file is a feeder's job (`epp.discovery.file`), which the
    composition root starts when the config names this plugin.
    """

    type_name: str
    name: str
    path: str
    watch_file: bool


def _file_discovery(name: str, params: Params, ctx: BuildContext) -> object:
    path = params.text("path", "")
    watch = params.flag("watchFile", False)
    params.finish()
    if not path:
        raise params.error("path", "required: the endpoints file to read")
    return FileDiscoveryPlugin("file-discovery", name, path, watch)


def _role_filter(make: Callable[[str], object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return make(name)

    return factory


@dataclass(frozen=True, slots=True)
class Marker:
    """A plugin with no behaviour of its own here: the single profile handler; a parser (the request path runs
    it: `epp.requests.parsers` holds the implementation of each parser type)."""

    type_name: str
    name: str


def _marker(type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return Marker(type_name, name)

    return factory


@dataclass(frozen=True, slots=True)
class DataLayerPlugin:
    """A data-layer plugin (upstream's metrics source and extractor): the scraper, not the scheduler, uses it.

    Its parameters are kept raw here, because the decision layer may not import the scraper: the composition
    root hands them to `epp.scrape.engines.engines_from_config`, which checks them field by field.
    """

    type_name: str
    name: str
    parameters: dict[str, object]


def _data_layer(type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        return DataLayerPlugin(type_name, name, params.rest())

    return factory


def _flow(build: Callable[[str, str, Params], object], type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        return build(type_name, name, params)

    return factory


def _named(build: Callable[[str, Params], object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        return build(name, params)

    return factory


def _register_flow_control(r: Callable[..., None]) -> None:
    fc = Kind.FLOW_CONTROL
    for t, summary in (
        ("global-strict-fairness-policy", "a band as one queue, in its ordering policy's order"),
        ("round-robin-fairness-policy", "each flow of a band in turn"),
        ("program-aware-fairness", "least attained service first (strategy las)"),
    ):
        r(t, fc, _flow(flow_plugins.fairness, t), summary)
    for t, summary in (
        ("fcfs-ordering-policy", "arrival order"),
        ("edf-ordering-policy", "earliest deadline (enqueue + TTL) first"),
        ("slo-deadline-ordering-policy", "earliest received + x-llm-d-slo-ttft-ms first"),
    ):
        r(t, fc, _flow(flow_plugins.ordering, t), summary)
    r("static-usage-limit-policy", fc, _flow(flow_plugins.usage_limit, "static-usage-limit-policy"), "one ceiling")
    r(
        "priority-holdback-policy",
        fc,
        _flow(flow_plugins.usage_limit, "priority-holdback-policy"),
        "ceilings linear from the highest band to the lowest",
        stability=Stability.ALPHA,
    )
    r(
        "soft-reflective-ceiling-policy",
        fc,
        _flow(flow_plugins.usage_limit, "soft-reflective-ceiling-policy"),
        "lower bands held back in proportion to saturation",
        stability=Stability.ALPHA,
    )
    r("concurrency-detector", Kind.FILTER, _named(flow_plugins.concurrency_detector), "in flight over capacity")
    r("probabilistic-admitter", Kind.ADMITTER, _named(flow_plugins.probabilistic_admitter), "sheds sheddable load")
    r("latency-slo-admitter", Kind.ADMITTER, _named(flow_plugins.latency_slo_admitter), "refuses unmeetable SLOs")


def register_builtins(registry: Registry) -> Registry:
    r = registry.register
    _register_flow_control(r)
    r("queue-scorer", Kind.SCORER, _no_params(scorers.QueueScorer), "min-max of waiting requests")
    r("kv-cache-utilization-scorer", Kind.SCORER, _no_params(scorers.KvCacheUtilizationScorer), "1 - KV usage")
    r("running-requests-size-scorer", Kind.SCORER, _no_params(scorers.RunningRequestsScorer), "min-max of running")
    r("inflight-load-scorer", Kind.SCORER, _no_params(scorers.InflightLoadScorer), "waiting + own unscraped picks")
    r("prefix-cache-scorer", Kind.SCORER, _prefix, "approximate prefix-cache affinity")
    r("lora-affinity-scorer", Kind.SCORER, _no_params(affinity.LoraAffinityScorer), "LoRA adapter affinity")
    r("session-affinity-scorer", Kind.SCORER, _session, "x-session-token stickiness", stability=Stability.ALPHA)
    r("utilization-detector", Kind.FILTER, _saturation_filter, "drops saturated or stale endpoints")
    r("saturation-filter", Kind.FILTER, _saturation_filter, "alias of utilization-detector")
    r("label-filter", Kind.FILTER, _label_filter, "keeps endpoints carrying matchLabels")
    r("by-label", Kind.FILTER, _by_label, "label value in validValues", replaced_by="label-selector-filter")
    r("decode-filter", Kind.FILTER, _role_filter(filters.decode_filter), "roles that decode; unlabelled kept")
    r("prefill-filter", Kind.FILTER, _role_filter(filters.prefill_filter), "roles that prefill")
    r("encode-filter", Kind.FILTER, _role_filter(filters.encode_filter), "roles that encode")
    r(
        "header-based-testing-filter",
        Kind.FILTER,
        _header_testing_filter,
        "conformance tests only: keeps the endpoints named by test-epp-endpoint-selection",
    )
    r("max-score-picker", Kind.PICKER, _picker(pickers.MaxScorePicker), "highest score, random tie-break")
    r("random-picker", Kind.PICKER, _picker(pickers.RandomPicker), "uniform")
    r("weighted-random-picker", Kind.PICKER, _picker(pickers.WeightedRandomPicker), "proportional to score")
    r("single-profile-handler", Kind.PROFILE_HANDLER, _marker("single-profile-handler"), "runs the one profile")
    r("openai-parser", Kind.PARSER, _marker("openai-parser"), "OpenAI API bodies and usage")
    r("anthropic-parser", Kind.PARSER, _marker("anthropic-parser"), "Anthropic Messages API bodies and usage")
    r("vllmhttp-parser", Kind.PARSER, _marker("vllmhttp-parser"), "vLLM /inference/v1/generate (token ids)")
    r("passthrough-parser", Kind.PARSER, _marker("passthrough-parser"), "any body, unread: a pool-level pick")
    r("file-discovery", Kind.DISCOVERY, _file_discovery, "endpoints from a YAML/JSON file, optionally watched")
    r("metrics-data-source", Kind.DATA_LAYER, _data_layer("metrics-data-source"), "the /metrics scraper (always on)")
    r(
        "core-metrics-extractor",
        Kind.DATA_LAYER,
        _data_layer("core-metrics-extractor"),
        "model-server metric names per engine (read by the scraper)",
    )
    return registry


def builtin_registry() -> Registry:
    return register_builtins(Registry())
