"""Names on the wire shared by the protocol, the gateway config and the tests (upstream's exact spellings)."""

DESTINATION_HEADER = "x-gateway-destination-endpoint"
DESTINATION_SERVED_HEADER = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
# Headers of ours a client must never set: stripped from the request before anything reads it.
ROUTING_HEADERS = (DESTINATION_HEADER, DESTINATION_SERVED_HEADER, "x-gateway-destination-endpoint-subset")
TIER_HEADER = "x-epp-allowed-tiers"  # a client may narrow its request's tiers (comma list), never widen them
# Set by a picker on a request it sends to a remote site (value: its tier). A picker never sends such a request to
# another site again: one hop at most, so two saturated sites cannot bounce a request between them.
HOP_HEADER = "x-epp-federated-from"
