"""Names on the wire shared by the protocol, the gateway config and the tests (upstream's exact spellings)."""

from collections.abc import Mapping

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_SERVED_HEADER = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
# With --emit-endpoint-scores: a struct in `envoy.lb` metadata, every endpoint the primary profile scored → its
# weighted score (upstream's metadata.DestinationEndpointScoresKey; metadata only, never a header).
DESTINATION_SCORES_KEY = "x-gateway-destination-endpoint-scores"
# With --emit-route-receipts (ours): beside the scores, the pick's route receipt as a JSON string (epp.scheduling
# .receipt: each scorer's share for the chosen endpoint and the runner-up, data ages, producers and fallbacks).
ROUTE_RECEIPT_KEY = "x-llm-d-route-receipt"
EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
# Headers of ours a client must never set: stripped from the request before anything reads it.
ROUTING_HEADERS = (DESTINATION_HEADER, DESTINATION_SERVED_HEADER, "x-gateway-destination-endpoint-subset")
TIER_HEADER = "x-epp-allowed-tiers"  # a client may narrow its request's tiers (comma list), never widen them
# Set by a picker on a request it sends to a remote site (value: its tier). A picker never sends such a request to
# another site again: one hop at most, so two saturated sites cannot bounce a request between them.
HOP_HEADER = "x-epp-federated-from"

# Request control headers: upstream's current names first, the older names as aliases (read when the current one is
# absent), as upstream reads them (llm-d-router pkg/epp/metadata).
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
MODEL_REWRITE_HEADERS = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SLO_TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")

# Conditional decode (RFC 7240): a coordinator's speculative decode attempt. The picker forwards it only when the
# endpoint it picks already holds part of the prompt in its KV cache, else answers 412 so the coordinator runs the
# whole encode/prefill/decode pipeline (upstream's routing.IsConditionalDecode and director gate).
PREFER_HEADER = "prefer"
PREFER_IF_AVAILABLE = "if-available"


def prefers_if_available(headers: Mapping[str, str]) -> bool:
    """The `Prefer` header lists the bare `if-available` token: comma-separated preferences, each with optional
    `;` parameters, the token matched case-insensitively, white space ignored (as upstream matches it)."""
    value = headers.get(PREFER_HEADER)
    if not value:
        return False
    return any(p.partition(";")[0].strip().lower() == PREFER_IF_AVAILABLE for p in value.split(","))


# On a refusal, why the request was dropped (upstream's header and values, pkg/common/error).
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
REJECTED_SATURATED = "rejected-saturated"
REJECTED_NO_ENDPOINTS = "rejected-no-endpoints"
REJECTED_UNKNOWN_POOL = "rejected-unknown-pool"  # ours: a picker of several pools could not tell the request's pool

# A picker that serves several InferencePools reads the request's pool from this gRPC metadata key of the ext_proc
# stream, `namespace/name` (or `name`, in the picker's namespace). The gateway sets it per route
# (ExtProcPerRoute.overrides.grpc_initial_metadata), so a client cannot set or spoof it.
POOL_METADATA = "x-llm-d-inference-pool"

# While a request waits in the flow-control queue the picker asks Envoy, every QUEUE_HOLD_S / 2, to wait QUEUE_HOLD_S
# more for its answer (ext_proc `override_message_timeout`), so the short `message_timeout` FailOpen needs does not
# fail a queued request. Envoy honours an override only up to the filter's `max_message_timeout`, which must
# therefore be at least QUEUE_HOLD_S (`epp envoy-config --max-message-timeout`, default 30s).
QUEUE_HOLD_S = 10.0

# Conformance: the endpoints a test asks for (IPs or ip:port, comma separated); honoured only when enabled.
TEST_ENDPOINT_SELECTION_HEADER = "test-epp-endpoint-selection"
