"""Every plugin type upstream's picker registers, and what this picker does with each: the table behind
docs/scheduling.md and behind the one-line refusal of a config naming a type we do not build. A STAND_IN type
loads without doing its job here (`epp.scheduling.stand_ins`: a documented safe behaviour, one warning).

Source: llm-d-router `cmd/epp/runner/runner.go` `registerInTreePlugins()` (the stability of each type as it is
registered there; ALPHA types need `--allow-experimental-plugins` upstream and here). A test checks this table
against the registry (a type is SUPPORTED or ALIAS exactly when the registry builds it) and against the docs.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Status(enum.Enum):
    SUPPORTED = "supported"
    ALIAS = "accepted as alias"
    # loads (upstream runs configs with it) but cannot do its job here: a safe behaviour, one warning per plugin
    STAND_IN = "loads, warns"
    REFUSED = "refused"


class UpstreamType(NamedTuple):
    type_name: str
    kind: str
    alpha: bool
    status: Status
    why: str


_S, _A, _W, _R = Status.SUPPORTED, Status.ALIAS, Status.STAND_IN, Status.REFUSED
_FC = "always used with enableEviction, listed or not (as upstream)"
_HEADERS = "deprecated upstream; nothing to do: the profile handler sets the P/D headers itself; warns on load"
_MC = "multi-cluster through InferencePoolImport is not implemented; epp federates sites instead (docs/federation.md)"
_LAT = "the picker's own online latency model, no sidecar: "
_MM = "multimodal requests are not recognised: "
_TOPO = "topology labels are not collected: "
_GPU = "GPU utilisation is not collected: collects nothing"

UPSTREAM_TYPES: tuple[UpstreamType, ...] = (
    # filters
    UpstreamType("label-selector-filter", "filter", False, _S, "matchLabels + matchExpressions (alias label-filter)"),
    UpstreamType("by-label-selector", "filter", False, _R, "deprecated upstream (v0.9) for label-selector-filter"),
    UpstreamType("by-label", "filter", False, _S, "deprecated upstream for label-selector-filter; warns on load"),
    UpstreamType(
        "decode-filter",
        "filter",
        False,
        _S,
        "roles decode, prefill-decode, both, encode-prefill-decode; unlabelled kept",
    ),
    UpstreamType(
        "prefill-filter",
        "filter",
        False,
        _S,
        "roles prefill, encode-prefill, prefill-decode, both, encode-prefill-decode",
    ),
    UpstreamType("encode-filter", "filter", False, _S, "roles encode, encode-prefill, encode-prefill-decode"),
    UpstreamType(
        "prefix-cache-affinity-filter",
        "filter",
        False,
        _S,
        "ttftSource prefillThroughput or latencyPredictor (the picker's own model); calibration files are not read",
    ),
    UpstreamType(
        "slo-headroom-tier-filter",
        "filter",
        False,
        _S,
        _LAT + "both SLOs met first; epsilonExploreNeg; ours: speedTiers",
    ),
    UpstreamType(
        "session-affinity-filter", "filter", True, _R, "session affinity is a scorer here (session-affinity-scorer)"
    ),
    UpstreamType("multicluster-session-affinity-filter", "filter", True, _R, _MC),
    UpstreamType(
        "endpoint-attribute-filter",
        "filter",
        True,
        _W,
        "attributes are not collected: every endpoint lacks it, onMissing decides (Pass keeps all)",
    ),
    UpstreamType("topology-affinity-filter", "filter", True, _W, _TOPO + "keeps every candidate"),
    UpstreamType(
        "utilization-filter", "filter", True, _R, "not implemented; utilization-detector filters saturated endpoints"
    ),
    UpstreamType(
        "header-based-testing-filter",
        "filter",
        False,
        _S,
        "conformance tests only: keeps the endpoints test-epp-endpoint-selection names",
    ),
    # scorers
    UpstreamType("queue-scorer", "scorer", False, _S, ""),
    UpstreamType("kv-cache-utilization-scorer", "scorer", False, _S, ""),
    UpstreamType("running-requests-size-scorer", "scorer", False, _S, ""),
    UpstreamType("lora-affinity-scorer", "scorer", False, _S, ""),
    UpstreamType(
        "prefix-cache-scorer",
        "scorer",
        False,
        _S,
        "reads a producer (prefixMatchInfoProducerName); the older self-contained parameters still work",
    ),
    UpstreamType(
        "session-affinity-scorer",
        "scorer",
        True,
        _S,
        "strategy encoded_endpoint_header (x-session-token written back on the response) or session_id "
        "(x-session-id, TTL 300 s)",
    ),
    UpstreamType(
        "active-request-scorer",
        "scorer",
        False,
        _S,
        "own in-flight requests; inflight-load-scorer (ours) differs: waiting + unscraped picks, min-max",
    ),
    UpstreamType("load-aware-scorer", "scorer", False, _S, ""),
    UpstreamType("context-length-aware", "scorer", False, _S, "reusableTokensProducerName refused (no p2p-source)"),
    UpstreamType("token-load-scorer", "scorer", False, _S, ""),
    UpstreamType("no-hit-lru-scorer", "scorer", False, _S, ""),
    UpstreamType("mm-embeddings-cache-scorer", "scorer", False, _W, _MM + "scores 0"),
    UpstreamType("latency-scorer", "scorer", False, _S, _LAT + "upstream's headroom rules, least or most"),
    UpstreamType(
        "precise-prefix-cache-scorer",
        "scorer",
        False,
        _S,
        "deprecated upstream; a prefix-cache-scorer over the config's precise producer, or one of its own; warns",
    ),
    UpstreamType("header-label-affinity-scorer", "scorer", True, _R, "not implemented"),
    UpstreamType("endpoint-attribute-scorer", "scorer", True, _W, "attributes are not collected: scores 0"),
    UpstreamType("topology-affinity-scorer", "scorer", True, _W, _TOPO + "scores 0"),
    UpstreamType("multicluster-queue-scorer", "scorer", True, _R, _MC),
    UpstreamType("multicluster-kv-cache-utilization-scorer", "scorer", True, _R, _MC),
    UpstreamType("multicluster-prefix-cache-scorer", "scorer", True, _R, _MC),
    # pickers
    UpstreamType("max-score-picker", "picker", False, _S, ""),
    UpstreamType("random-picker", "picker", False, _S, ""),
    UpstreamType("weighted-random-picker", "picker", False, _S, ""),
    # profile handlers and deciders
    UpstreamType("single-profile-handler", "profile handler", False, _S, ""),
    UpstreamType("disagg-profile-handler", "profile handler", False, _S, "decode; prefill and encode when decided"),
    UpstreamType(
        "pd-profile-handler",
        "profile handler",
        False,
        _S,
        "deprecated upstream (v0.7) for disagg-profile-handler; warns on load",
    ),
    UpstreamType("header-profile-handler", "profile handler", True, _R, "not implemented"),
    UpstreamType(
        "data-parallel-profile-handler",
        "profile handler",
        False,
        _S,
        "deprecated upstream; primaryPort and x-data-parallel-host-port, as upstream",
    ),
    UpstreamType("prefix-based-pd-decider", "decider", False, _S, "nonCachedTokens, promptTokens"),
    UpstreamType("always-disagg-pd-decider", "decider", False, _S, ""),
    UpstreamType("always-disagg-multimodal-decider", "decider", False, _W, _MM + "the encode stage never runs"),
    UpstreamType("disagg-headers-handler", "pre-request", False, _S, _HEADERS),
    UpstreamType(
        "prefill-header-handler", "pre-request", False, _A, "older name of disagg-headers-handler; warns on load"
    ),
    # data layer
    UpstreamType("metrics-data-source", "data source", False, _S, "always on; the scraper"),
    UpstreamType("core-metrics-extractor", "data extractor", False, _S, "per-engine metric names honoured"),
    UpstreamType("file-discovery", "endpoint discovery", False, _S, "dataLayer.discovery; path, watchFile"),
    UpstreamType("models-data-source", "data source", False, _R, "/v1/models is not polled"),
    UpstreamType("models-data-extractor", "data extractor", False, _R, "/v1/models is not polled"),
    UpstreamType("endpoint-notification-source", "data source", False, _S, "membership for the KV-events feeder"),
    UpstreamType("k8s-notification-source", "data source", False, _R, "the Kubernetes watches feed the table directly"),
    UpstreamType("dcgm-data-source", "data source", True, _W, _GPU),
    UpstreamType("dcgm-extractor", "data extractor", True, _W, _GPU),
    UpstreamType("topology-extractor", "data extractor", True, _W, _TOPO + "collects nothing"),
    UpstreamType("multicluster-file-discovery", "endpoint discovery", True, _R, _MC),
    UpstreamType("multicluster-metrics-data-source", "data source", True, _R, _MC),
    UpstreamType("multicluster-metrics-extractor", "data extractor", True, _R, _MC),
    # flow control
    UpstreamType("global-strict-fairness-policy", "flow-control policy", False, _S, ""),
    UpstreamType("round-robin-fairness-policy", "flow-control policy", False, _S, ""),
    UpstreamType("program-aware-fairness", "flow-control policy", False, _S, ""),
    UpstreamType("fcfs-ordering-policy", "flow-control policy", False, _S, ""),
    UpstreamType("edf-ordering-policy", "flow-control policy", False, _S, ""),
    UpstreamType("slo-deadline-ordering-policy", "flow-control policy", False, _S, ""),
    UpstreamType("static-usage-limit-policy", "flow-control policy", False, _S, ""),
    UpstreamType("priority-holdback-policy", "flow-control policy", True, _S, ""),
    UpstreamType("soft-reflective-ceiling-policy", "flow-control policy", True, _S, ""),
    UpstreamType("sheddable-eviction-filter", "flow-control eviction", True, _S, _FC),
    UpstreamType("priority-then-time-eviction-order-policy", "flow-control eviction", True, _S, _FC),
    UpstreamType(
        "utilization-detector", "saturation detector", False, _S, "also usable as a filter (alias saturation-filter)"
    ),
    UpstreamType(
        "concurrency-detector", "saturation detector", False, _S, "modes requests, tokens, hybrid; also a filter"
    ),
    # admission
    UpstreamType(
        "latency-slo-admitter", "admitter", False, _S, _LAT + "idle, cold, or an endpoint predicted to meet it"
    ),
    UpstreamType("probabilistic-admitter", "admitter", False, _S, ""),
    # producers
    UpstreamType("approx-prefix-cache-producer", "producer", False, _S, "token blocks; estimate tokens by default"),
    UpstreamType("inflight-load-producer", "producer", False, _S, ""),
    UpstreamType("predicted-latency-producer", "producer", False, _S, _LAT + "sidecar parameters noted as not needed"),
    UpstreamType("mm-embeddings-cache-producer", "producer", False, _W, _MM + "publishes no match"),
    UpstreamType("token-producer", "producer", False, _S, "estimate; vllm render endpoints, estimate on failure"),
    UpstreamType("tokenizer", "producer", False, _A, "deprecated upstream for token-producer; warns on load"),
    UpstreamType("session-id-producer", "producer", False, _S, ""),
    UpstreamType(
        "precise-prefix-cache-producer",
        "producer",
        False,
        _S,
        "engines' KV events; without a vllm token-producer, or with a central zmqEndpoint: the approximate "
        "fallback, one warning",
    ),
    UpstreamType(
        "burst-prefix-cache-producer",
        "producer",
        True,
        _S,
        "decided online at arrival (no added latency) instead of batched per window",
    ),
    UpstreamType("p2p-source-producer", "producer", True, _R, "P2P KV-cache transfer is not implemented"),
    UpstreamType("multicluster-approx-prefix-cache-producer", "producer", True, _R, _MC),
    # other hooks
    UpstreamType(
        "request-attribute-reporter",
        "request hook",
        False,
        _W,
        "CEL is not evaluated: reports nothing (usage is a metric)",
    ),
    UpstreamType("agent-identity", "request hook", True, _R, "not implemented"),
    UpstreamType("disaggregatedset-rollout-screener", "request hook", True, _R, "not implemented"),
    UpstreamType(
        "destination-endpoint-served-verifier", "response hook", False, _R, "the served-endpoint check is built in"
    ),
    # parsers
    UpstreamType("openai-parser", "parser", False, _S, ""),
    UpstreamType("anthropic-parser", "parser", False, _S, "/v1/messages; usage from JSON and SSE"),
    UpstreamType("vllmhttp-parser", "parser", False, _S, "/inference/v1/generate"),
    UpstreamType("passthrough-parser", "parser", False, _S, "no body parsing: a pool-level pick"),
    UpstreamType("vllmgrpc-parser", "parser", False, _R, "gRPC model-server protocols are not parsed"),
    UpstreamType("sglanghttp-parser", "parser", False, _R, "not implemented"),
    UpstreamType("vertexai-parser", "parser", False, _R, "gRPC model-server protocols are not parsed"),
)

BY_NAME = {t.type_name: t for t in UPSTREAM_TYPES}


def describe_unimplemented(type_name: str) -> str:
    """For a refusal: ` (upstream producer: <why>)` when upstream knows the type, else nothing."""
    known = BY_NAME.get(type_name)
    if known is None:
        return ""
    return f" (upstream {known.kind}{', alpha' if known.alpha else ''}: {known.why})"
