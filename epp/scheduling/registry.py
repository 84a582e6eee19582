"""Plugin types by name: the one table of the types a binary accepts, each with its kind, stability and factory.

Registration is explicit (`register_builtins`), never a side effect of importing a module, so the set of types a
binary accepts is written in one place and a test can build a registry with only the types it wants. A new type is
one `r(...)` line below; its factory goes in the factory module of its kind (`scorer_factories`,
`producer_factories`, `selection_factories`, `handler_factories`, `config_plugins`), or in the plugin's module.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.scheduling import (
    affinity,
    disagg,
    filters,
    flow_plugins,
    pickers,
    producers,
    scorers,
    slo_factories,
    stand_ins,
)
from epp.scheduling.config_plugins import data_layer, file_discovery, marker
from epp.scheduling.handler_factories import data_parallel_handler, disagg_handler, pd_handler, prefix_decider
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext, Factory, Kind, PluginType, Stability, no_params
from epp.scheduling.producer_factories import (
    approx_prefix_producer,
    burst_producer,
    precise_prefix_producer,
    session_id_producer,
    token_producer,
)
from epp.scheduling.scorer_factories import (
    active_request_scorer,
    context_length_scorer,
    load_aware_scorer,
    no_hit_lru_scorer,
    precise_prefix_scorer,
    prefill_queue_scorer,
    prefix_scorer,
    session_affinity_scorer,
    token_load_scorer,
)
from epp.scheduling.selection_factories import (
    by_label_filter,
    header_testing_filter,
    label_filter,
    label_selector_filter,
    picker,
    prefix_affinity_filter,
    rendezvous_picker,
    role_filter,
    saturation_filter,
)


class Registry:
    """Plugin types by name; registering a name twice is an error, so two modules cannot silently disagree."""

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
    r(
        "self-calibrating-detector",
        Kind.FILTER,
        flow_plugins.self_calibrating_detector,
        "load over each endpoint's learned knee (ours)",
    )
    r("probabilistic-admitter", Kind.ADMITTER, _named(flow_plugins.probabilistic_admitter), "sheds sheddable load")
    r("latency-slo-admitter", Kind.ADMITTER, slo_factories.latency_slo_admitter, "refuses unmeetable SLOs")
    r("slo-headroom-tier-filter", Kind.FILTER, slo_factories.headroom_filter, "endpoints with SLO headroom first")
    r("latency-scorer", Kind.SCORER, slo_factories.latency_scorer, "predicted TTFT/TPOT headroom")
    r(
        "predicted-latency-producer",
        Kind.PRODUCER,
        slo_factories.latency_producer,
        "per-endpoint TTFT/TPOT predictions, learned online",
    )


def _register_stand_ins(r: Callable[..., None]) -> None:
    """Upstream types that load but cannot do their job here (`epp.scheduling.stand_ins`): one warning each."""
    alpha = Stability.ALPHA
    gpu = "GPU utilisation (DCGM) is not collected here: this plugin collects nothing"
    topology = "topology labels are not collected here: "
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
    r("queue-scorer", Kind.SCORER, no_params(scorers.QueueScorer), "min-max of waiting requests")
    r("kv-cache-utilization-scorer", Kind.SCORER, no_params(scorers.KvCacheUtilizationScorer), "1 - KV usage")
    r("running-requests-size-scorer", Kind.SCORER, no_params(scorers.RunningRequestsScorer), "min-max of running")
    r("inflight-load-scorer", Kind.SCORER, no_params(scorers.InflightLoadScorer), "waiting + own unscraped picks")
    r("prefix-cache-scorer", Kind.SCORER, prefix_scorer, "approximate prefix-cache affinity")
    r(
        "precise-prefix-cache-scorer",
        Kind.SCORER,
        precise_prefix_scorer,
        "prefix-cache-scorer over a precise producer (its own, or the config's)",
        replaced_by="precise-prefix-cache-producer",
    )
    r("lora-affinity-scorer", Kind.SCORER, no_params(affinity.LoraAffinityScorer), "LoRA adapter affinity")
    r(
        "session-affinity-scorer",
        Kind.SCORER,
        session_affinity_scorer,
        "x-session-token stickiness",
        stability=Stability.ALPHA,
    )
    r("load-aware-scorer", Kind.SCORER, load_aware_scorer, "0.5 at an empty queue, 0 at threshold")
    r("active-request-scorer", Kind.SCORER, active_request_scorer, "fewer own in-flight requests")
    r("token-load-scorer", Kind.SCORER, token_load_scorer, "fewer in-flight + uncached prompt tokens")
    r("prefill-queue-scorer", Kind.SCORER, prefill_queue_scorer, "least queued + own uncached prefill tokens")
    r("no-hit-lru-scorer", Kind.SCORER, no_hit_lru_scorer, "cold requests to the least recently cold-picked endpoint")
    r("context-length-aware", Kind.SCORER, context_length_scorer, "token count vs the endpoint's length-range label")
    r("approx-prefix-cache-producer", Kind.PRODUCER, approx_prefix_producer, "per-endpoint token-block prefix match")
    r(
        "precise-prefix-cache-producer",
        Kind.PRODUCER,
        precise_prefix_producer,
        "per-endpoint prefix match from the engines' KV-cache events",
    )
    r("token-producer", Kind.PRODUCER, token_producer("token-producer"), "the prompt's tokens (estimate or vllm)")
    r(
        "tokenizer",
        Kind.PRODUCER,
        token_producer("tokenizer"),
        "deprecated name of token-producer",
        replaced_by="token-producer",
    )
    r("inflight-load-producer", Kind.PRODUCER, no_params(producers.InflightLoadProducer), "own in-flight load")
    r("session-id-producer", Kind.PRODUCER, session_id_producer, "session id and its bound endpoint")
    r(
        "burst-prefix-cache-producer",
        Kind.PRODUCER,
        burst_producer,
        "co-locates a burst of prompt-sharing requests",
        stability=Stability.ALPHA,
    )
    r("label-selector-filter", Kind.FILTER, label_selector_filter, "Kubernetes label selector over endpoint labels")
    r("prefix-cache-affinity-filter", Kind.FILTER, prefix_affinity_filter, "keeps the sticky endpoints until loaded")
    r("utilization-detector", Kind.FILTER, saturation_filter, "drops saturated endpoints and unusable data")
    r("saturation-filter", Kind.FILTER, saturation_filter, "alias of utilization-detector")
    r("label-filter", Kind.FILTER, label_filter, "alias of label-selector-filter (ours)")
    r("by-label", Kind.FILTER, by_label_filter, "label value in validValues", replaced_by="label-selector-filter")
    for t, make, summary in (  # upstream builds each as a by-label filter, and reports that type
        ("decode-filter", filters.decode_filter, "roles that decode; unlabelled kept"),
        ("prefill-filter", filters.prefill_filter, "roles that prefill"),
        ("encode-filter", filters.encode_filter, "roles that encode"),
    ):
        r(t, Kind.FILTER, role_filter(make), summary, reported_type="by-label")
    r(
        "header-based-testing-filter",
        Kind.FILTER,
        header_testing_filter,
        "conformance tests only: keeps the endpoints named by test-epp-endpoint-selection",
    )
    r("max-score-picker", Kind.PICKER, picker(pickers.MaxScorePicker), "highest score, random tie-break")
    r("random-picker", Kind.PICKER, picker(pickers.RandomPicker), "uniform")
    r("weighted-random-picker", Kind.PICKER, picker(pickers.WeightedRandomPicker), "proportional to score")
    r(
        "rendezvous-picker",
        Kind.PICKER,
        rendezvous_picker,
        "ours: rendezvous hashing of the leading prefix within a load band (active-active replicas agree)",
    )
    r("single-profile-handler", Kind.PROFILE_HANDLER, marker("single-profile-handler"), "runs the one profile")
    r("disagg-profile-handler", Kind.PROFILE_HANDLER, disagg_handler, "decode; prefill/encode when decided")
    r(
        "pd-profile-handler",
        Kind.PROFILE_HANDLER,
        pd_handler,
        "older parameters of disagg-profile-handler",
        replaced_by="disagg-profile-handler",
    )
    r(
        "data-parallel-profile-handler",
        Kind.PROFILE_HANDLER,
        data_parallel_handler,
        "one profile; primaryPort + x-data-parallel-host-port",
        replaced_by="single-profile-handler",
    )
    r("prefix-based-pd-decider", Kind.DECIDER, prefix_decider, "P/D when enough prompt is not cached on decode")
    r("always-disagg-pd-decider", Kind.DECIDER, no_params(disagg.AlwaysDisaggDecider), "P/D for every request")
    r("openai-parser", Kind.PARSER, marker("openai-parser"), "OpenAI API bodies and usage")
    r("anthropic-parser", Kind.PARSER, marker("anthropic-parser"), "Anthropic Messages API bodies and usage")
    r("vllmhttp-parser", Kind.PARSER, marker("vllmhttp-parser"), "vLLM /inference/v1/generate (token ids)")
    r("passthrough-parser", Kind.PARSER, marker("passthrough-parser"), "any body, unread: a pool-level pick")
    r("file-discovery", Kind.DISCOVERY, file_discovery, "endpoints from a YAML/JSON file, optionally watched")
    r("metrics-data-source", Kind.DATA_LAYER, data_layer("metrics-data-source"), "the /metrics scraper (always on)")
    r(
        "endpoint-notification-source",
        Kind.DATA_LAYER,
        data_layer("endpoint-notification-source"),
        "endpoint membership for the KV-events feeder (always on with precise-prefix-cache-producer)",
    )
    r(
        "core-metrics-extractor",
        Kind.DATA_LAYER,
        data_layer("core-metrics-extractor"),
        "model-server metric names per engine (read by the scraper)",
    )
    return registry


def builtin_registry() -> Registry:
    return register_builtins(Registry())
