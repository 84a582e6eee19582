"""Factories of the data-producer types (upstream's `dataproducer` plugins): the parameters of each producer, and
what of upstream's has no counterpart here refused by name.
"""

from __future__ import annotations

from epp.scheduling import producers
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext, Factory
from epp.scheduling.precise import PrecisePrefixCacheProducer


def approx_prefix_producer(name: str, params: Params, ctx: BuildContext) -> object:
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


def precise_prefix_producer(name: str, params: Params, ctx: BuildContext) -> object:
    """Upstream's parameters (`dataproducer/preciseprefixcache`): what maps onto the KV-events index is taken, what
    has no counterpart here is refused by name (Redis or cost-aware index backends); a central ZMQ endpoint loads
    with one warning (each endpoint is subscribed to instead)."""
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


def token_producer(type_name: str) -> Factory:
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


def session_id_producer(name: str, params: Params, ctx: BuildContext) -> object:
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


def burst_producer(name: str, params: Params, ctx: BuildContext) -> object:
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
