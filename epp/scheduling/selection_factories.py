"""Factories of the filter and picker types: what narrows the candidates and what picks among them.

The label selector's `matchExpressions` are checked here, item by item, so a bad selector is refused at load with
the index of the offending item rather than matching nothing at run time.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.config.model import SaturationThresholds
from epp.scheduling import affinity_filter, conformance_selection, filters, rendezvous, saturation
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext, Factory


def label_selector_filter(name: str, params: Params, ctx: BuildContext) -> object:
    wanted = params.mapping("matchLabels")
    raw = params.records("matchExpressions")
    params.finish()
    expressions: list[tuple[str, str, frozenset[str]]] = []
    for i, item in enumerate(raw):
        where = f"matchExpressions[{i}]"
        key, operator, values = item.get("key"), item.get("operator"), item.get("values", [])
        unknown = set(item) - {"key", "operator", "values"}
        if unknown:
            raise params.error(where, f"unknown field(s) {', '.join(sorted(unknown))}")
        if not isinstance(key, str) or not key:
            raise params.error(where, "key: required")
        if operator not in filters.SELECTOR_OPERATORS:
            raise params.error(where, f"operator: expected one of {', '.join(filters.SELECTOR_OPERATORS)}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise params.error(where, "values: expected a list of strings")
        if operator in ("In", "NotIn") and not values:
            raise params.error(where, f"values: required for {operator}")
        if operator in ("Exists", "DoesNotExist") and values:
            raise params.error(where, f"values: must be empty for {operator}")
        expressions.append((key, operator, frozenset(values)))
    return filters.LabelFilter("label-selector-filter", name, filters.label_selector(wanted, tuple(expressions)))


def prefix_affinity_filter(name: str, params: Params, ctx: BuildContext) -> object:
    source = params.text("ttftSource", "prefillThroughput")
    for field_name in ("prefillCalibrationFile", "prefillCalibrationFingerprint", "prefillCalibrationRequired"):
        if params.present(field_name):
            raise params.error(field_name, "calibration records are not read here; set peakPrefillThroughput")
    plugin = affinity_filter.PrefixCacheAffinityFilter(
        name,
        threshold=params.number("affinityThreshold", 0.80, minimum=0.0, maximum=1.0),
        exploration=params.number("explorationProbability", 0.0, minimum=0.0, maximum=1.0),
        max_penalty_ms=params.number("maxTTFTPenaltyMs", 18000.0, minimum=0.0),
        peak_prefill_tps=params.number("peakPrefillThroughput", 15928.0, minimum=1e-9),
        prefix_producer=params.text("prefixMatchInfoProducerName", "") or "approx-prefix-cache-producer",
        load_producer=params.text("inFlightLoadProducerName", "") or "inflight-load-producer",
        seed=ctx.next_seed(),
        latency_producer=_latency_producer(ctx) if source == "latencyPredictor" else "",
    )
    params.finish()
    if source not in ("prefillThroughput", "latencyPredictor"):
        raise params.error("ttftSource", f"{source!r}: expected prefillThroughput or latencyPredictor")
    return plugin


def _latency_producer(ctx: BuildContext) -> str:
    """The config's predicted-latency-producer (the TTFT estimate of `ttftSource: latencyPredictor`)."""
    for plugin_name, type_name in ctx.plugin_types.items():
        if type_name == "predicted-latency-producer":
            return plugin_name
    return "predicted-latency-producer"


def picker(cls: Callable[..., object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        k = params.integer("maxNumOfEndpoints", 1, minimum=1)
        params.finish()
        return cls(name, max_endpoints=k, seed=ctx.next_seed())

    return factory


def rendezvous_picker(name: str, params: Params, ctx: BuildContext) -> object:
    k = params.integer("maxNumOfEndpoints", 1, minimum=1)
    band = params.number("band", rendezvous.DEFAULT_BAND, minimum=0.0, maximum=1.0)
    key_bytes = params.integer("keyBytes", rendezvous.DEFAULT_KEY_BYTES, minimum=1)
    load_factor = params.number("loadFactor", rendezvous.DEFAULT_LOAD_FACTOR, minimum=0.0)
    params.finish()
    return rendezvous.RendezvousPicker(
        name, max_endpoints=k, seed=ctx.next_seed(), band=band, key_bytes=key_bytes, load_factor=load_factor
    )


def saturation_filter(name: str, params: Params, ctx: BuildContext) -> object:
    base = ctx.saturation  # the config's saturationDetector block, overridable per filter
    pool = ctx.freshness.staleness_s
    staleness = params.duration("metricsStalenessThreshold", pool)
    if staleness != pool:  # one per pool (`build.pool_freshness` takes it from the config): never two
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


def label_filter(name: str, params: Params, ctx: BuildContext) -> object:
    """`label-filter` (ours, older): an alias of label-selector-filter that needs a non-empty selector."""
    if not params.present("matchLabels") and not params.present("matchExpressions"):
        raise params.error("matchLabels", "required: the labels an endpoint must carry")
    plugin = label_selector_filter(name, params, ctx)
    assert isinstance(plugin, filters.LabelFilter)
    plugin.type_name = "label-filter"
    return plugin


def by_label_filter(name: str, params: Params, ctx: BuildContext) -> object:
    label = params.text("label", "")
    valid = params.strings("validValues")
    allow_missing = params.flag("allowsNoLabel", False)
    params.finish()
    if not label:
        raise params.error("label", "required: the label to test")
    return filters.LabelFilter("by-label", name, filters.label_in(label, valid, allow_missing))


def header_testing_filter(name: str, params: Params, ctx: BuildContext) -> object:
    params.finish()
    return conformance_selection.HeaderBasedTestingFilter(name)


def role_filter(make: Callable[[str], object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        params.finish()
        return make(name)

    return factory
