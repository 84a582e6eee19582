"""Factories of upstream's SLO-aware types (`epp.scheduling.slo`), reading upstream's parameters as upstream does.

The producer's model is the picker's own (`epp.scheduling.latency_model`): upstream's sidecars (their URLs come from
the environment there, not the config) are not needed, and the producer's parameters that only steer them
(`contextTTL`, `predictInProduce: false`'s training-only mode, `endpointRoleLabel`, the encoder-cache features) are
accepted and noted once at load as not needed here. Consumers name the producer (`latencyPredictionInfoProducerName`)
or find the config's one predicted-latency-producer.
"""

from __future__ import annotations

from epp.scheduling.latency_model import LatencyModel
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext
from epp.scheduling.slo import (
    TYPE,
    HeadroomTierFilter,
    LatencyScorer,
    PredictedLatencyProducer,
    PredictiveSloAdmitter,
)

_NOT_NEEDED = "not needed here (the picker learns latency from its own observations, no sidecar): "


def latency_producer(name: str, params: Params, ctx: BuildContext) -> PredictedLatencyProducer:
    params.ignore("samplingMean", "maxDecodeTokenSamplesForPrediction")  # deprecated upstream and ignored there
    buffer = params.number("sloBufferFactor", 1.0, minimum=1e-9)
    unused = [key for key in ("contextTTL", "predictInProduce", "endpointRoleLabel") if params.present(key)]
    params.duration("contextTTL", 0.0)
    params.flag("streamingMode", False)  # ours reads each response's own content type
    params.text("endpointRoleLabel", "")
    params.flag("predictInProduce", True)
    prefix = params.text("prefixMatchInfoProducerName", "")
    params.text("inFlightLoadProducerName", "")  # our in-flight counts are the endpoint table's, whoever names them
    encoder = params.flag("useEncoderCacheFeatures", False)
    params.text("encoderCacheMatchInfoProducerName", "")
    params.finish()
    if encoder:
        unused.append("useEncoderCacheFeatures")
    if unused:
        ctx.warn(f"plugin '{name}' ({TYPE})", _NOT_NEEDED + ", ".join(unused))
    return PredictedLatencyProducer(name, LatencyModel(), buffer, prefix)


def _producer(params: Params, ctx: BuildContext) -> str:
    """The producer a consumer reads: named, else the config's predicted-latency-producer (upstream's default key)."""
    named = params.text("latencyPredictionInfoProducerName", "")
    if named:
        return named
    for plugin_name, type_name in ctx.plugin_types.items():
        if type_name == TYPE:
            return plugin_name
    return TYPE


def headroom_filter(name: str, params: Params, ctx: BuildContext) -> HeadroomTierFilter:
    epsilon = params.number("epsilonExploreNeg", 0.01, minimum=0.0, maximum=1.0)
    speed_tiers = params.flag("speedTiers", False)  # ours: the slowest hardware class that meets the SLO
    producer = _producer(params, ctx)
    params.finish()
    built = ctx.plugin(producer)
    model = built.model if speed_tiers and isinstance(built, PredictedLatencyProducer) else None
    return HeadroomTierFilter(name, producer, epsilon, ctx.next_seed(), model)


def latency_scorer(name: str, params: Params, ctx: BuildContext) -> LatencyScorer:
    ttft = params.number("ttftWeight", 0.8, minimum=0.0)
    tpot = params.number("tpotWeight", 0.2, minimum=0.0)
    strategy = params.text("headroomSelectionStrategy", "least") or "least"
    composite = tuple(
        params.number(weight, 1.0, minimum=0.0)  # the fallback while nothing is predicted
        for weight in ("compositeKVWeight", "compositeQueueWeight", "compositePrefixWeight")
    )
    producer = _producer(params, ctx)
    params.text("prefixMatchInfoProducerName", "")
    params.finish()
    if strategy not in ("least", "most"):
        raise params.error("headroomSelectionStrategy", f"expected least or most, got {strategy!r}")
    return LatencyScorer(name, producer, ttft, tpot, strategy == "most", composite)  # type: ignore[arg-type]


def latency_slo_admitter(name: str, params: Params, ctx: BuildContext) -> PredictiveSloAdmitter:
    producer = ctx.plugin(_producer(params, ctx))
    params.finish()
    return PredictiveSloAdmitter(name, producer if isinstance(producer, PredictedLatencyProducer) else None)
