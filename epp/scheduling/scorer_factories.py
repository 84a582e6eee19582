"""Factories of the scorer types: each reads upstream's parameters for one scorer and refuses what does not fit.

Kept together because scorers share upstream's conventions (a non-positive threshold means the default, a
`...ProducerName` parameter names the data producer a scorer reads).
"""

from __future__ import annotations

from epp.scheduling import affinity, load_scorers, prefix
from epp.scheduling.framework import Producer
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext
from epp.scheduling.producer_factories import precise_prefix_producer

_PREFIX_NEW = ("prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens")
_PREFIX_OLD = ("blockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "autoTune")


def prefix_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    """Two forms, as upstream's history: the current one reads a producer's match (`prefixMatchInfoProducerName`,
    `matchLengthWeight`, `matchLengthScaleTokens`, or no parameters: then upstream's auto-created
    approx-prefix-cache-producer); the older one (blockSize, maxPrefixBlocksToMatch, lruCapacityPerServer, autoTune)
    computes its own match, exactly as before (the built-in profiles name it: `build.default_config`)."""
    new = [f for f in _PREFIX_NEW if params.present(f)]
    old = [f for f in _PREFIX_OLD if params.present(f)]
    if new and old:
        raise params.error(
            old[0], f"the producer form ({', '.join(new)}) and the self-contained form ({', '.join(old)}) do not mix"
        )
    if new or not old:
        producer = params.text("prefixMatchInfoProducerName", "") or "approx-prefix-cache-producer"
        weight = params.number("matchLengthWeight", 0.0, minimum=0.0, maximum=1.0)
        scale = params.integer("matchLengthScaleTokens", 0, minimum=0)
        params.finish()
        if weight > 0.0 and scale <= 0:
            raise params.error("matchLengthScaleTokens", "must be > 0 when matchLengthWeight is > 0")
        return load_scorers.ProducedPrefixScorer(name, producer, weight, scale)
    scorer = prefix.PrefixCacheScorer(
        name,
        block_size=params.integer("blockSize", 64, minimum=1),
        max_blocks=params.integer("maxPrefixBlocksToMatch", 256, minimum=1),
        lru_capacity=params.integer("lruCapacityPerServer", 31250, minimum=2),
        auto_tune=params.flag("autoTune", True),
    )
    params.finish()
    return scorer


def session_affinity_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    strategy = params.text("strategy", "") or params.text("algorithm", affinity.ENCODED_ENDPOINT_HEADER)
    strategy = {"session_id_header": affinity.SESSION_ID}.get(strategy, strategy)  # upstream's older spelling
    if strategy not in (affinity.ENCODED_ENDPOINT_HEADER, affinity.SESSION_ID):
        raise params.error("strategy", f"expected encoded_endpoint_header or session_id, got {strategy!r}")
    ttl = params.duration("ttl", 300.0) if params.present("ttl") else params.number("evictionTtlSeconds", 300.0)
    scorer = affinity.SessionAffinityScorer(
        name,
        max_sessions=params.integer("maxSessions", 100_000, minimum=1),
        strategy=strategy,
        header=params.text("headerName", "") or None,
        ttl_s=ttl,
    )
    params.finish()
    if ttl <= 0:
        raise params.error("ttl", "must be > 0")
    return scorer


def load_aware_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    threshold = params.integer("threshold", 128)
    params.finish()
    return load_scorers.LoadAwareScorer(name, threshold if threshold > 0 else 128)  # upstream: <= 0 → default


def active_request_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    params.ignore("requestTimeout")  # deprecated upstream and ignored: the in-flight producer tracks lifetimes
    scorer = load_scorers.ActiveRequestScorer(
        name,
        idle=params.integer("idleThreshold", 0, minimum=0),
        max_busy=params.number("maxBusyScore", 1.0, minimum=0.0, maximum=1.0),
        producer=params.text("inFlightLoadProducerName", ""),
    )
    params.finish()
    return scorer


def token_load_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    threshold = params.integer("queueThresholdTokens", 4_194_304)
    scorer = load_scorers.TokenLoadScorer(
        name,
        threshold=threshold if threshold > 0 else 4_194_304,  # upstream: <= 0 → default
        producer=params.text("inFlightLoadProducerName", ""),
        prefix_producer=params.text("prefixMatchInfoProducerName", ""),
    )
    params.finish()
    return scorer


def prefill_queue_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    scorer = load_scorers.PrefillQueueScorer(name, prefix_producer=params.text("prefixMatchInfoProducerName", ""))
    params.finish()
    return scorer


def no_hit_lru_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    params.ignore("prefixPluginType", "prefixPluginName")  # deprecated upstream, never used there
    size = params.integer("lruSize", 1024)
    scorer = load_scorers.NoHitLruScorer(
        name, lru_size=size if size > 0 else 1024, producer=params.text("prefixMatchInfoProducerName", "")
    )
    params.finish()
    return scorer


def context_length_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    label = params.text("label", load_scorers.CONTEXT_LENGTH_LABEL)
    filtering = params.flag("enableFiltering", False)
    if params.present("reusableTokensProducerName"):
        raise params.error("reusableTokensProducerName", "p2p-source-producer is not implemented here")
    params.finish()
    if not label:
        raise params.error("label", "must be specified")
    return load_scorers.ContextLengthAware(name, label, filtering)


class PrecisePrefixScorer(load_scorers.ProducedPrefixScorer):
    """`precise-prefix-cache-scorer` (deprecated upstream) with no precise producer in its config: the scorer and
    the producer it reads in one plugin, as upstream's; the builder runs `embedded_producer` with the others."""

    def __init__(self, name: str, embedded_producer: Producer) -> None:
        super().__init__(name, embedded_producer.name)
        self.embedded_producer = embedded_producer


def precise_prefix_scorer(name: str, params: Params, ctx: BuildContext) -> object:
    """Upstream's deprecated `precise-prefix-cache-scorer`: a prefix-cache-scorer over the config's one
    precise-prefix-cache-producer (its own parameters then unused, as upstream), or, with none, over a precise
    producer of its own built from its parameters (upstream's: those of precise-prefix-cache-producer)."""
    existing = sorted(n for n, t in ctx.plugin_types.items() if t == "precise-prefix-cache-producer")
    if len(existing) > 1:
        raise params.error(
            "prefixMatchInfoProducerName",
            f"several precise-prefix-cache-producers ({', '.join(existing)}): use prefix-cache-scorer naming one",
        )
    if existing:
        params.rest()
        return load_scorers.ProducedPrefixScorer(name, existing[0])
    producer = precise_prefix_producer(name, params, ctx)
    return PrecisePrefixScorer(name, producer)  # type: ignore[arg-type]
