"""The ext_proc HTTP filter that asks the picker, configured for the pool's failure mode and the body mode.

Every message Envoy sends costs the picker Python CPU (~80–100 µs each, benchmarks/RESULTS.md), so the processing
mode asks only for what the decision needs — request headers and body — plus the response phases the operator
chose. `allow_mode_override` lets the picker ask for more on a single request (e.g. the response body when a
model rewrite must be undone) without making every request pay for it.
"""

from __future__ import annotations

from envoy.config.core.v3 import grpc_service_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2
from envoy.type.v3 import http_status_pb2

from epp import wire
from epp.gateway.clusters import EPP_CLUSTER, duration
from epp.gateway.options import BodyMode, GatewayOptions, ResponsePhases

_Mode = processing_mode_pb2.ProcessingMode
# What a refused FailClose request answers when the picker cannot be reached: 503 says "try again later" to
# clients and matches the picker's own answer when it has no endpoint; Envoy's default would be 500.
FAIL_CLOSE_STATUS = http_status_pb2.StatusCode.ServiceUnavailable


def processing_mode(options: GatewayOptions) -> processing_mode_pb2.ProcessingMode:
    full_duplex = options.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    mode = _Mode(
        request_header_mode=_Mode.SEND,
        request_body_mode=_Mode.FULL_DUPLEX_STREAMED if full_duplex else _Mode.BUFFERED,
        # Envoy requires trailers to be sent with FULL_DUPLEX_STREAMED: they are how a body without end_of_stream
        # ends.
        request_trailer_mode=_Mode.SEND if full_duplex else _Mode.SKIP,
        response_header_mode=_Mode.SKIP,
        response_body_mode=_Mode.NONE,
        response_trailer_mode=_Mode.SKIP,
    )
    if options.response_phases in (ResponsePhases.HEADERS, ResponsePhases.BODY):
        mode.response_header_mode = _Mode.SEND
    if options.response_phases is ResponsePhases.BODY:
        # Streamed chunk by chunk (never buffered: an SSE stream would stall until its end).
        mode.response_body_mode = _Mode.FULL_DUPLEX_STREAMED if full_duplex else _Mode.STREAMED
        mode.response_trailer_mode = _Mode.SEND if full_duplex else _Mode.SKIP
    return mode


def response_body_override(options: GatewayOptions) -> processing_mode_pb2.ProcessingMode:
    """The one override a picker may ask for per request: the configured mode plus the response body."""
    mode = processing_mode(options)
    full_duplex = options.body_mode is BodyMode.FULL_DUPLEX_STREAMED
    mode.response_header_mode = _Mode.SEND
    mode.response_body_mode = _Mode.FULL_DUPLEX_STREAMED if full_duplex else _Mode.STREAMED
    mode.response_trailer_mode = _Mode.SEND if full_duplex else _Mode.SKIP
    return mode


def extproc_filter(options: GatewayOptions) -> ext_proc_pb2.ExternalProcessor:
    config = ext_proc_pb2.ExternalProcessor(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EPP_CLUSTER)
        ),
        # FailOpen: a picker that cannot be reached lets the request continue, and the route's pool cluster picks
        # a member itself. FailClose: Envoy answers at once (status_on_error) and nothing reaches a backend.
        failure_mode_allow=options.fail_open,
        processing_mode=processing_mode(options),
        # Short, so a hung picker fails over quickly under FailOpen; the picker extends it (override_message_timeout,
        # up to max_message_timeout) while it holds a request in its flow-control queue.
        message_timeout=duration(options.message_timeout_s),
        max_message_timeout=duration(options.max_message_timeout_s),
        metadata_options=ext_proc_pb2.MetadataOptions(
            # Without this Envoy silently drops the picker's `envoy.lb` metadata, and with it the decision.
            receiving_namespaces=ext_proc_pb2.MetadataOptions.MetadataNamespaces(untyped=[wire.LB_NAMESPACE]),
        ),
        stat_prefix="epp",
    )
    if not options.fail_open:
        config.status_on_error.code = FAIL_CLOSE_STATUS
    if options.response_phases is not ResponsePhases.BODY:
        config.allow_mode_override = True
        config.allowed_override_modes.append(response_body_override(options))
    return config
