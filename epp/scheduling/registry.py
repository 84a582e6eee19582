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
from epp.scheduling import (
    affinity,
    affinity_filter,
    disagg,
    filters,
    flow_plugins,
    load_scorers,
    pickers,
    prefix,
    producers,
    rendezvous,
    saturation,
    scorers,
    stand_ins,
    test_selection,
)
from epp.scheduling.params import Params
from epp.scheduling.precise import PrecisePrefixCacheProducer


class Kind(enum.Enum):
    FILTER = "filter"
    SCORER = "scorer"
    PICKER = "picker"
    PROFILE_HANDLER = "profile handler"
    DECIDER = "decider"  # whether a disaggregated stage runs for a request (read by the profile handler)
    PARSER = "parser"
    DATA_LAYER = "data-layer plugin"
    DISCOVERY = "endpoint-discovery plugin"
    FLOW_CONTROL = "flow-control policy"
    ADMITTER = "admitter"
    # Upstream's data producers (approx-prefix-cache-producer, token-producer, ...): they run for every request
    # before the filters and write data that scorers read, naming the producer in a parameter (e.g. the prefix
    # scorer's `prefixMatchInfoProducerName`). Built before every other plugin, so such a factory finds its
    # producer with `BuildContext.plugin`.
    PRODUCER = "data producer"
    # Upstream's pre-request and response plugins (disagg-headers-handler, request-attribute-reporter): listed in a
    # profile, they are skipped there, as upstream's profile keeps only its filters, scorers and picker.
    REQUEST_HOOK = "request hook"


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
    built: dict[str, object] = field(default_factory=dict)  # the plugins built so far, by name (producers first)
    plugin_types: dict[str, str] = field(default_factory=dict)  # every plugin of the config: name → type
    warnings: list[str] = field(default_factory=list)  # what loads but is not done here, one line per plugin

    def warn(self, where: str, why: str) -> None:
        """A plugin that loads but cannot do (all of) its job here: logged once at start-up, printed by check-config."""
        line = f"{where}: {why}"
        if line not in self.warnings:
            self.warnings.append(line)

    def has_type(self, *types: str) -> bool:
        return any(t in types for t in self.plugin_types.values())

    def next_seed(self) -> int:
        return int(self.seed_sequence.spawn(1)[0].generate_state(1)[0])

    def plugin(self, name: str) -> object | None:
        """A plugin built earlier (every producer is): for a factory whose parameter names another plugin."""
        return self.built.get(name)


Factory = Callable[[str, Params, BuildContext], object]


@dataclass(frozen=True, slots=True)
class PluginType:
    type_name: str
    kind: Kind
    factory: Factory
    summary: str
    stability: Stability = Stability.BETA
    replaced_by: str | None = None  # deprecated upstream in favour of this type: loading it logs a warning
    limitation: str | None = None  # loads, but cannot do its job here: this is logged once per plugin (stand_ins)
    reported_type: str | None = None  # the type upstream's instance reports when it differs (decode-filter: by-label)


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
        limitation: str | None = None,
        reported_type: str | None = None,
    ) -> None:
        if type_name in self._types:
            raise ValueError(f"plugin type {type_name!r} registered twice")
        self._types[type_name] = PluginType(
            type_name, kind, factory, summary, stability, replaced_by, limitation, reported_type
        )

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


_PREFIX_NEW = ("prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens")
_PREFIX_OLD = ("blockSize", "maxPrefixBlocksToMatch", "lruCapacityPerServer", "autoTune")
PREFIX_PRODUCER_TYPES = ("approx-prefix-cache-producer", "burst-prefix-cache-producer", "precise-prefix-cache-producer")


def _prefix(name: str, params: Params, ctx: BuildContext) -> object:
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


def _session(name: str, params: Params, ctx: BuildContext) -> object:
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


def _approx_prefix_producer(name: str, params: Params, ctx: BuildContext) -> object:
    params.ignore("blockSize")  # upstream's deprecated character-based block size: blockSizeTokens replaces it
    producer = producers.ApproxPrefixCacheProducer(
        name,
        block_tokens=params.integer("blockSizeTokens", 16, minimum=1),
        max_tokens=params.integer("maxPrefixTokensToMatch", 131072, minimum=0),
        max_blocks=params.integer("maxPrefixBlocksToMatch", 2048, minimum=0),
        lru_capacity=params.integer("lruCapacityPerServer", 31250, minimum=2),
        auto_tune=params.flag("autoTune", True),
    )
    params.finish()
    return producer


def _precise_prefix_producer(name: str, params: Params, ctx: BuildContext) -> object:
    """Upstream's parameters (`dataproducer/preciseprefixcache`): what maps onto the KV-events index is taken, what
    has no counterpart here is refused by name (Redis or cost-aware index backends, a central ZMQ endpoint)."""
    tokens = Params(params.section("tokenProcessorConfig"), f"{params.where}: tokenProcessorConfig")
    block = tokens.integer("blockSizeTokens", 0, minimum=0) or tokens.integer("blockSize", 16, minimum=1)
    seed = tokens.text("hashSeed", "")
    tokens.finish()
    indexer = Params(params.section("indexerConfig"), f"{params.where}: indexerConfig")
    index = Params(indexer.section("kvBlockIndexConfig"), f"{params.where}: indexerConfig.kvBlockIndexConfig")
    index.ignore("enableMetrics", "metricsLoggingInterval")  # the index's metrics are always exported
    memory = Params(index.section("inMemoryConfig"), f"{params.where}: kvBlockIndexConfig.inMemoryConfig")
    memory.ignore("podCacheSize")  # an index entry holds a bit per endpoint, not a bounded pod list
    max_blocks = memory.integer("size", 65_536, minimum=1)
    memory.finish()
    for other in ("costAwareMemoryConfig", "redisConfig", "valkeyConfig"):
        if index.present(other):
            raise index.error(other, "only the in-memory index is implemented here")
    index.finish()
    indexer.ignore("tokenizersPoolConfig", "prefixStoreConfig")  # tokens come from the token-producer
    indexer.finish()
    events = Params(params.section("kvEventsConfig"), f"{params.where}: kvEventsConfig")
    topic = events.text("topicFilter", "kv@")
    events.ignore("concurrency", "discoverPods")  # one feeder process; endpoints always come from discovery
    central = events.text("zmqEndpoint", "")
    if central:
        ctx.warn(
            f"plugin '{name}' (precise-prefix-cache-producer)",
            f"kvEventsConfig.zmqEndpoint {central}: a central endpoint the engines publish to is not bound here; "
            "each endpoint is subscribed to at podDiscoveryConfig.socketPort instead, so engines that publish only "
            "to the central endpoint are not heard and their requests use the approximate fallback",
        )
    discovery = Params(events.section("podDiscoveryConfig"), f"{params.where}: kvEventsConfig.podDiscoveryConfig")
    port = discovery.integer("socketPort", 5557, minimum=1)
    replay = discovery.integer("replaySocketPort", 0, minimum=0)
    discovery.finish()
    events.finish()
    speculative = params.flag("speculativeIndexing", False)
    ttl = params.duration("speculativeTTL", 2.0)
    stale = params.duration("staleAfter", 10.0)
    params.finish()
    if port > 65535 or replay > 65535:
        raise params.error("kvEventsConfig", "socket ports must be at most 65535")
    return PrecisePrefixCacheProducer(
        name,
        block_size=block,
        hash_seed=seed,
        socket_port=port,
        replay_port=replay or None,
        topic_filter=topic,
        max_blocks_per_endpoint=max_blocks,
        stale_after_s=stale,
        speculative=speculative,
        speculative_ttl_s=ttl,
    )


def _token_producer(type_name: str) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        model = params.text("modelName", "")
        vllm = params.section("vllm")
        params.ignore("estimate")  # multimodal placeholder estimates: text prompts only here
        backend = params.text("backend", "vllm" if (model or vllm) else "estimate")
        params.finish()
        if backend not in ("estimate", "vllm"):
            raise params.error("backend", f"expected estimate or vllm, got {backend!r}")
        inner = Params(vllm, f"{params.where}: vllm")
        url = inner.text("url", "http://localhost:8000")
        timeout = inner.duration("timeout", 5.0)
        mm_timeout = inner.duration("mmTimeout", 30.0)
        cache = inner.integer("cacheSize", 4096, minimum=1)
        inner.finish()
        params.effective["vllm"] = dict(inner.effective)
        if backend == "vllm" and not model:
            raise params.error("modelName", "required for the vllm backend")
        return producers.TokenProducer(
            name,
            backend=backend,
            type_name=type_name,
            model_name=model,
            url=url,
            timeout_s=timeout,
            chat_timeout_s=max(timeout, mm_timeout),
            cache_size=cache,
        )

    return factory


def _session_id_producer(name: str, params: Params, ctx: BuildContext) -> object:
    header = params.text("headerName", "")
    cookie = params.text("cookieName", "")
    lru = params.integer("lruSize", 1024, minimum=1)
    ttl = params.duration("ttl", 1800.0)
    params.finish()
    if header and cookie:
        raise params.error("cookieName", "set headerName or cookieName, not both")
    if ttl <= 0:
        raise params.error("ttl", "must be > 0")
    return producers.SessionIdProducer(
        name, header=header or (None if cookie else "x-session-id"), cookie=cookie or None, lru_size=lru, ttl_s=ttl
    )


def _burst_producer(name: str, params: Params, ctx: BuildContext) -> object:
    producer = producers.BurstPrefixCacheProducer(
        name,
        window_s=params.integer("windowDurationMs", 100, minimum=1) / 1000.0,
        max_per_replica=params.integer("maxPerReplica", -1, minimum=-1),
        block_tokens=params.integer("blockSizeTokens", 64, minimum=1),
        max_tokens=params.integer("maxPrefixTokensToMatch", 0, minimum=0),
        min_colocate_blocks=params.integer("minColocateBlocks", 0, minimum=0),
    )
    params.finish()
    if producer.max_per_replica == 0:
        raise params.error("maxPerReplica", "must be -1 (unlimited) or >= 1")
    return producer


def _load_aware(name: str, params: Params, ctx: BuildContext) -> object:
    threshold = params.integer("threshold", 128)
    params.finish()
    return load_scorers.LoadAwareScorer(name, threshold if threshold > 0 else 128)  # upstream: <= 0 → default


def _active_request(name: str, params: Params, ctx: BuildContext) -> object:
    params.ignore("requestTimeout")  # deprecated upstream and ignored: the in-flight producer tracks lifetimes
    scorer = load_scorers.ActiveRequestScorer(
        name,
        idle=params.integer("idleThreshold", 0, minimum=0),
        max_busy=params.number("maxBusyScore", 1.0, minimum=0.0, maximum=1.0),
        producer=params.text("inFlightLoadProducerName", ""),
    )
    params.finish()
    return scorer


def _token_load(name: str, params: Params, ctx: BuildContext) -> object:
    threshold = params.integer("queueThresholdTokens", 4_194_304)
    scorer = load_scorers.TokenLoadScorer(
        name,
        threshold=threshold if threshold > 0 else 4_194_304,  # upstream: <= 0 → default
        producer=params.text("inFlightLoadProducerName", ""),
        prefix_producer=params.text("prefixMatchInfoProducerName", ""),
    )
    params.finish()
    return scorer


def _no_hit_lru(name: str, params: Params, ctx: BuildContext) -> object:
    params.ignore("prefixPluginType", "prefixPluginName")  # deprecated upstream, never used there
    size = params.integer("lruSize", 1024)
    scorer = load_scorers.NoHitLruScorer(
        name, lru_size=size if size > 0 else 1024, producer=params.text("prefixMatchInfoProducerName", "")
    )
    params.finish()
    return scorer


def _context_length(name: str, params: Params, ctx: BuildContext) -> object:
    label = params.text("label", load_scorers.CONTEXT_LENGTH_LABEL)
    filtering = params.flag("enableFiltering", False)
    if params.present("reusableTokensProducerName"):
        raise params.error("reusableTokensProducerName", "p2p-source-producer is not implemented here")
    params.finish()
    if not label:
        raise params.error("label", "must be specified")
    return load_scorers.ContextLengthAware(name, label, filtering)


def _label_selector(name: str, params: Params, ctx: BuildContext) -> object:
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


def _prefix_affinity_filter(name: str, params: Params, ctx: BuildContext) -> object:
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
    )
    params.finish()
    if source != "prefillThroughput":
        raise params.error("ttftSource", f"{source!r}: only prefillThroughput (latency prediction is not implemented)")
    return plugin


def _picker(cls: Callable[..., object]) -> Factory:
    def factory(name: str, params: Params, ctx: BuildContext) -> object:
        k = params.integer("maxNumOfEndpoints", 1, minimum=1)
        params.finish()
        return cls(name, max_endpoints=k, seed=ctx.next_seed())

    return factory


def _rendezvous_picker(name: str, params: Params, ctx: BuildContext) -> object:
    k = params.integer("maxNumOfEndpoints", 1, minimum=1)
    band = params.number("band", rendezvous.DEFAULT_BAND, minimum=0.0, maximum=1.0)
    key_bytes = params.integer("keyBytes", rendezvous.DEFAULT_KEY_BYTES, minimum=1)
    load_factor = params.number("loadFactor", rendezvous.DEFAULT_LOAD_FACTOR, minimum=0.0)
    params.finish()
    return rendezvous.RendezvousPicker(
        name, max_endpoints=k, seed=ctx.next_seed(), band=band, key_bytes=key_bytes, load_factor=load_factor
    )


def _saturation_filter(name: str, params: Params, ctx: BuildContext) -> object:
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


def _label_filter(name: str, params: Params, ctx: BuildContext) -> object:
    """`label-filter` (ours, older): an alias of label-selector-filter that needs a non-empty selector."""
    if not params.present("matchLabels") and not params.present("matchExpressions"):
        raise params.error("matchLabels", "required: the labels an endpoint must carry")
    plugin = _label_selector(name, params, ctx)
    assert isinstance(plugin, filters.LabelFilter)
    plugin.type_name = "label-filter"
    return plugin


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
class HandlerSpec:
    """A profile handler as configured: which profile each stage runs and which decider gates it. The builder
    resolves the names once every plugin exists (a decider may be listed after the handler)."""

    type_name: str
    name: str
    decode: str | None = None  # None: the config's one profile (single and data-parallel handlers)
    prefill: str = "prefill"
    encode: str = "encode"
    prefill_decider: str | None = None
    encode_decider: str | None = None
    primary_port: int = 0


def _disagg_handler(name: str, params: Params, ctx: BuildContext) -> object:
    profiles = Params(params.section("profiles"), f"{params.where}: profiles")
    decode = profiles.text("decode", "decode")
    prefill = profiles.text("prefill", "prefill")
    encode = profiles.text("encode", "encode")
    profiles.finish()
    deciders = Params(params.section("deciders"), f"{params.where}: deciders")
    prefill_decider = deciders.text("prefill", "") or None
    encode_decider = deciders.text("encode", "") or None
    deciders.finish()
    params.finish()
    return HandlerSpec("disagg-profile-handler", name, decode, prefill, encode, prefill_decider, encode_decider)


def _port(params: Params, default: int) -> int:
    port = params.integer("primaryPort", default, minimum=0)
    if port > 65535:
        raise params.error("primaryPort", f"must be between 1 and 65535, got {port}")
    return port


def _pd_handler(name: str, params: Params, ctx: BuildContext) -> object:
    """The deprecated `pd-profile-handler`: the disagg handler under its older parameter names."""
    decode = params.text("decodeProfile", "decode")
    prefill = params.text("prefillProfile", "prefill")
    decider = params.text("deciderPluginName", "prefix-based-pd-decider")
    if not decider:
        raise params.error("deciderPluginName", "decider plugin name is not defined")
    port = _port(params, 0)
    params.ignore("prefixPluginType", "prefixPluginName", "prefixMatchInfoProducerName")  # never used upstream
    params.finish()
    return HandlerSpec("pd-profile-handler", name, decode, prefill, prefill_decider=decider, primary_port=port)


def _dp_handler(name: str, params: Params, ctx: BuildContext) -> object:
    port = _port(params, 8000)
    params.finish()
    return HandlerSpec("data-parallel-profile-handler", name, primary_port=port)


def _prefix_decider(name: str, params: Params, ctx: BuildContext) -> object:
    non_cached = params.integer("nonCachedTokens", 0, minimum=0)
    prompt = params.integer("promptTokens", 0, minimum=0)
    producer = params.text("prefixMatchInfoProducerName", disagg.DEFAULT_PREFIX_PRODUCER)
    params.finish()
    return disagg.PrefixBasedDecider(name, non_cached, prompt, producer)


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
        ("round-robin-fairness-policy", "each flow of a band in turn; overShareCeiling: the fair-share gate (ours)"),
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
    for t, summary in (
        ("sheddable-eviction-filter", "in-flight eviction takes only priority < 0 (always, with enableEviction)"),
        ("priority-then-time-eviction-order-policy", "evicts the lowest priority, newest dispatch first (always)"),
    ):
        r(t, fc, _flow(flow_plugins.eviction_policy, t), summary, stability=Stability.ALPHA)
    r("concurrency-detector", Kind.FILTER, _named(flow_plugins.concurrency_detector), "in flight over capacity")
    r("probabilistic-admitter", Kind.ADMITTER, _named(flow_plugins.probabilistic_admitter), "sheds sheddable load")
    r("latency-slo-admitter", Kind.ADMITTER, _named(flow_plugins.latency_slo_admitter), "refuses unmeetable SLOs")


def _register_stand_ins(r: Callable[..., None]) -> None:
    """Upstream types that load but cannot do their job here (`epp.scheduling.stand_ins`): one warning each."""
    alpha = Stability.ALPHA
    gpu = "GPU utilisation (DCGM) is not collected here: this plugin collects nothing"
    topology = "topology labels are not collected here: "
    latency = "latency prediction (upstream's trained-model sidecar) is not implemented here: "
    mm = "multimodal requests are not recognised here: "
    for t, kind, factory, summary, stability, limitation in (
        (
            "endpoint-attribute-filter",
            Kind.FILTER,
            stand_ins.attribute_filter,
            "endpoints by a collected attribute",
            alpha,
            "endpoint attributes are not collected here: every endpoint lacks the attribute, so onMissing decides "
            "for all (Pass keeps every candidate)",
        ),
        (
            "endpoint-attribute-scorer",
            Kind.SCORER,
            stand_ins.attribute_scorer,
            "endpoints by a collected attribute",
            alpha,
            "endpoint attributes are not collected here: scores 0 for every endpoint",
        ),
        (
            "topology-affinity-filter",
            Kind.FILTER,
            stand_ins.topology_filter,
            "near the peer stage's pick",
            alpha,
            topology + "keeps every candidate",
        ),
        (
            "topology-affinity-scorer",
            Kind.SCORER,
            stand_ins.topology_scorer,
            "near the peer stage's pick",
            alpha,
            topology + "scores 0 for every endpoint",
        ),
        (
            "topology-extractor",
            Kind.DATA_LAYER,
            stand_ins.topology_extractor,
            "topology labels",
            alpha,
            topology + "this plugin collects nothing",
        ),
        ("dcgm-data-source", Kind.DATA_LAYER, stand_ins.dcgm_source, "DCGM exporter scrape", alpha, gpu),
        ("dcgm-extractor", Kind.DATA_LAYER, stand_ins.dcgm_extractor, "GPU utilisation", alpha, gpu),
        (
            "slo-headroom-tier-filter",
            Kind.FILTER,
            stand_ins.headroom_filter,
            "endpoints with SLO headroom first",
            Stability.BETA,
            latency + "keeps every candidate",
        ),
        (
            "latency-scorer",
            Kind.SCORER,
            stand_ins.latency_scorer,
            "predicted TTFT/TPOT headroom",
            Stability.BETA,
            latency + "scores 0 for every endpoint (the other scorers decide; alone, every endpoint ties)",
        ),
        (
            "predicted-latency-producer",
            Kind.PRODUCER,
            stand_ins.latency_producer,
            "per-endpoint TTFT/TPOT predictions",
            Stability.BETA,
            latency + "publishes no prediction",
        ),
        (
            "mm-embeddings-cache-producer",
            Kind.PRODUCER,
            stand_ins.mm_producer,
            "encoder-cache hits per endpoint",
            Stability.BETA,
            mm + "publishes no encoder-cache match",
        ),
        (
            "mm-embeddings-cache-scorer",
            Kind.SCORER,
            stand_ins.mm_scorer,
            "encoder-cache affinity",
            Stability.BETA,
            mm + "scores 0 for every endpoint",
        ),
        (
            "always-disagg-multimodal-decider",
            Kind.DECIDER,
            stand_ins.multimodal_decider,
            "encode stage for multimodal requests",
            Stability.BETA,
            mm + "the encode stage never runs",
        ),
        (
            "request-attribute-reporter",
            Kind.REQUEST_HOOK,
            stand_ins.attribute_reporter,
            "CEL over usage into dynamic metadata",
            Stability.BETA,
            "CEL expressions are not evaluated here: no attribute is reported",
        ),
    ):
        r(t, kind, _named(factory), summary, stability=stability, limitation=limitation)
    for t in ("disagg-headers-handler", "prefill-header-handler"):
        r(
            t,
            Kind.REQUEST_HOOK,
            _named(stand_ins.headers_handler),
            "P/D headers (set by the profile handler here)",
            replaced_by="disagg-profile-handler",
            reported_type="disagg-headers-handler",
        )


def register_builtins(registry: Registry) -> Registry:
    r = registry.register
    _register_flow_control(r)
    _register_stand_ins(r)
    r("queue-scorer", Kind.SCORER, _no_params(scorers.QueueScorer), "min-max of waiting requests")
    r("kv-cache-utilization-scorer", Kind.SCORER, _no_params(scorers.KvCacheUtilizationScorer), "1 - KV usage")
    r("running-requests-size-scorer", Kind.SCORER, _no_params(scorers.RunningRequestsScorer), "min-max of running")
    r("inflight-load-scorer", Kind.SCORER, _no_params(scorers.InflightLoadScorer), "waiting + own unscraped picks")
    r("prefix-cache-scorer", Kind.SCORER, _prefix, "approximate prefix-cache affinity")
    r("lora-affinity-scorer", Kind.SCORER, _no_params(affinity.LoraAffinityScorer), "LoRA adapter affinity")
    r("session-affinity-scorer", Kind.SCORER, _session, "x-session-token stickiness", stability=Stability.ALPHA)
    r("load-aware-scorer", Kind.SCORER, _load_aware, "0.5 at an empty queue, 0 at threshold")
    r("active-request-scorer", Kind.SCORER, _active_request, "fewer own in-flight requests")
    r("token-load-scorer", Kind.SCORER, _token_load, "fewer in-flight + uncached prompt tokens")
    r("no-hit-lru-scorer", Kind.SCORER, _no_hit_lru, "cold requests to the least recently cold-picked endpoint")
    r("context-length-aware", Kind.SCORER, _context_length, "token count vs the endpoint's length-range label")
    r("approx-prefix-cache-producer", Kind.PRODUCER, _approx_prefix_producer, "per-endpoint token-block prefix match")
    r(
        "precise-prefix-cache-producer",
        Kind.PRODUCER,
        _precise_prefix_producer,
        "per-endpoint prefix match from the engines' KV-cache events",
    )
    r("token-producer", Kind.PRODUCER, _token_producer("token-producer"), "the prompt's tokens (estimate or vllm)")
    r(
        "tokenizer",
        Kind.PRODUCER,
        _token_producer("tokenizer"),
        "deprecated name of token-producer",
        replaced_by="token-producer",
    )
    r("inflight-load-producer", Kind.PRODUCER, _no_params(producers.InflightLoadProducer), "own in-flight load")
    r("session-id-producer", Kind.PRODUCER, _session_id_producer, "session id and its bound endpoint")
    r(
        "burst-prefix-cache-producer",
        Kind.PRODUCER,
        _burst_producer,
        "co-locates a burst of prompt-sharing requests",
        stability=Stability.ALPHA,
    )
    r("label-selector-filter", Kind.FILTER, _label_selector, "Kubernetes label selector over endpoint labels")
    r("prefix-cache-affinity-filter", Kind.FILTER, _prefix_affinity_filter, "keeps the sticky endpoints until loaded")
    r("utilization-detector", Kind.FILTER, _saturation_filter, "drops saturated endpoints and unusable data")
    r("saturation-filter", Kind.FILTER, _saturation_filter, "alias of utilization-detector")
    r("label-filter", Kind.FILTER, _label_filter, "alias of label-selector-filter (ours)")
    r("by-label", Kind.FILTER, _by_label, "label value in validValues", replaced_by="label-selector-filter")
    for t, make, summary in (  # upstream builds each as a by-label filter, and reports that type
        ("decode-filter", filters.decode_filter, "roles that decode; unlabelled kept"),
        ("prefill-filter", filters.prefill_filter, "roles that prefill"),
        ("encode-filter", filters.encode_filter, "roles that encode"),
    ):
        r(t, Kind.FILTER, _role_filter(make), summary, reported_type="by-label")
    r(
        "header-based-testing-filter",
        Kind.FILTER,
        _header_testing_filter,
        "conformance tests only: keeps the endpoints named by test-epp-endpoint-selection",
    )
    r("max-score-picker", Kind.PICKER, _picker(pickers.MaxScorePicker), "highest score, random tie-break")
    r("random-picker", Kind.PICKER, _picker(pickers.RandomPicker), "uniform")
    r("weighted-random-picker", Kind.PICKER, _picker(pickers.WeightedRandomPicker), "proportional to score")
    r(
        "rendezvous-picker",
        Kind.PICKER,
        _rendezvous_picker,
        "ours: rendezvous hashing of the leading prefix within a load band (active-active replicas agree)",
    )
    r("single-profile-handler", Kind.PROFILE_HANDLER, _marker("single-profile-handler"), "runs the one profile")
    r("disagg-profile-handler", Kind.PROFILE_HANDLER, _disagg_handler, "decode; prefill/encode when decided")
    r(
        "pd-profile-handler",
        Kind.PROFILE_HANDLER,
        _pd_handler,
        "older parameters of disagg-profile-handler",
        replaced_by="disagg-profile-handler",
    )
    r(
        "data-parallel-profile-handler",
        Kind.PROFILE_HANDLER,
        _dp_handler,
        "one profile; primaryPort + x-data-parallel-host-port",
        replaced_by="single-profile-handler",
    )
    r("prefix-based-pd-decider", Kind.DECIDER, _prefix_decider, "P/D when enough prompt is not cached on decode")
    r("always-disagg-pd-decider", Kind.DECIDER, _no_params(disagg.AlwaysDisaggDecider), "P/D for every request")
    r("openai-parser", Kind.PARSER, _marker("openai-parser"), "OpenAI API bodies and usage")
    r("anthropic-parser", Kind.PARSER, _marker("anthropic-parser"), "Anthropic Messages API bodies and usage")
    r("vllmhttp-parser", Kind.PARSER, _marker("vllmhttp-parser"), "vLLM /inference/v1/generate (token ids)")
    r("passthrough-parser", Kind.PARSER, _marker("passthrough-parser"), "any body, unread: a pool-level pick")
    r("file-discovery", Kind.DISCOVERY, _file_discovery, "endpoints from a YAML/JSON file, optionally watched")
    r("metrics-data-source", Kind.DATA_LAYER, _data_layer("metrics-data-source"), "the /metrics scraper (always on)")
    r(
        "endpoint-notification-source",
        Kind.DATA_LAYER,
        _data_layer("endpoint-notification-source"),
        "endpoint membership for the KV-events feeder (always on with precise-prefix-cache-producer)",
    )
    r(
        "core-metrics-extractor",
        Kind.DATA_LAYER,
        _data_layer("core-metrics-extractor"),
        "model-server metric names per engine (read by the scraper)",
    )
    return registry


def builtin_registry() -> Registry:
    return register_builtins(Registry())
