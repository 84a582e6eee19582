"""Minimal Envoy bootstraps as plain dicts: the test suite's, the benchmarks' and the demo's gateways.

Composable pieces (listener, ext_proc filter, clusters): ext_proc to the picker, then an original-destination
cluster routed by the picker's `envoy.lb` metadata, which clients cannot set. These are deliberately small and
explicit; `epp envoy-config` renders the production configuration.
"""

from __future__ import annotations

from typing import Any

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def _address(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def processing_mode(request_body: str, response_body: str = "", response_headers: bool = True) -> dict[str, str]:
    mode = {
        "request_header_mode": "SEND",
        "request_body_mode": request_body,
        "response_header_mode": "SEND" if response_headers else "SKIP",
        "response_body_mode": response_body or "NONE",
    }
    if request_body == "FULL_DUPLEX_STREAMED":
        mode["request_trailer_mode"] = "SEND"  # Envoy requires it with this body mode
    if response_body == "FULL_DUPLEX_STREAMED":
        mode["response_trailer_mode"] = "SEND"
    return mode


def ext_proc_filter(
    cluster: str, mode: dict[str, str], message_timeout: str = "10s", max_message_timeout: str = "30s"
) -> dict[str, Any]:
    """`max_message_timeout` bounds what the picker may ask for while it holds a queued request."""
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _EXT_PROC,
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}, "timeout": "10s"},
            "processing_mode": mode,
            "message_timeout": message_timeout,
            "max_message_timeout": max_message_timeout,
            "failure_mode_allow": False,
            "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
        },
    }


_STDERR_LOG = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StderrAccessLog"
# One line per request Envoy answered 5xx, on its stderr (the test's or the demo's log file): why it failed
# (RESPONSE_CODE_DETAILS says e.g. ext_proc's gRPC error or an upstream reset, RESPONSE_FLAGS the same in short),
# so a failure seen once on a shared machine can be read afterwards. Nothing is written while requests succeed.
_FAILURES_LOG = {
    "name": "envoy.access_loggers.stderr",
    "filter": {
        "status_code_filter": {"comparison": {"op": "GE", "value": {"default_value": 500, "runtime_key": "log_5xx"}}}
    },
    "typed_config": {
        "@type": _STDERR_LOG,
        "log_format": {
            "text_format_source": {
                "inline_string": "[access 5xx] %START_TIME% %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% "
                "flags=%RESPONSE_FLAGS% details=%RESPONSE_CODE_DETAILS% upstream=%UPSTREAM_HOST% "
                "failure=%UPSTREAM_TRANSPORT_FAILURE_REASON% %DURATION%ms\n"
            }
        },
    },
}


def listener(name: str, port: int, route: dict[str, Any], filters: list[dict[str, Any]]) -> dict[str, Any]:
    """An HTTP listener whose one route does `route` (e.g. {"cluster": ...} or a direct response)."""
    return {
        "name": name,
        "address": _address(port),
        # BUFFERED mode holds the whole body: let bodies up to the picker's own limit through,
        # so the picker (not Envoy) answers 413 with its reason.
        "per_connection_buffer_limit_bytes": 32 * 1024 * 1024,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": _HCM,
                            "stat_prefix": name,
                            "access_log": [_FAILURES_LOG],
                            "route_config": {
                                "virtual_hosts": [
                                    {"name": name, "domains": ["*"], "routes": [{"match": {"prefix": "/"}, **route}]}
                                ]
                            },
                            "http_filters": [
                                *filters,
                                {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
                            ],
                        },
                    }
                ]
            }
        ],
    }


def pool_cluster(name: str = "pool") -> dict[str, Any]:
    """Original destination, chosen by the picker's `envoy.lb` metadata, which clients cannot set."""
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "1s",
        "original_dst_lb_config": {
            "metadata_key": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}
        },
    }


def upstream_tls(sni: str = "localhost") -> dict[str, Any]:
    """TLS to the picker (its default), unverified as gateways dial it: see epp.gateway.clusters.upstream_tls."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _UPSTREAM_TLS,
            "sni": sni,
            "common_tls_context": {"alpn_protocols": ["h2"]},
        },
    }


def static_cluster(
    name: str, port: int, http2: bool = False, tls: bool = False, streams_per_connection: int = 0
) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(port)}}]}],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _HTTP_OPTS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
        if streams_per_connection:
            options = cluster["typed_extension_protocol_options"][
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
            ]
            options["common_http_protocol_options"] = {"max_requests_per_connection": streams_per_connection}
    if tls:
        cluster["transport_socket"] = upstream_tls()
    return cluster


def bootstrap(listeners: list[dict[str, Any]], clusters: list[dict[str, Any]], admin_port: int) -> dict[str, Any]:
    return {
        "admin": {"address": _address(admin_port)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def gateway_bootstrap(
    listen_port: int,
    admin_port: int,
    epp_port: int,
    body_mode: str,
    response_body_mode: str = "",
    tls: bool = True,
    streams_per_connection: int = 0,
    message_timeout: str = "10s",
) -> dict[str, Any]:
    """One listener: ext_proc to the picker (over TLS, the picker's default), then the original-destination pool
    cluster."""
    mode = processing_mode(body_mode, response_body_mode or body_mode)
    route = {"route": {"cluster": "pool", "timeout": "30s"}}
    return bootstrap(
        [listener("gateway", listen_port, route, [ext_proc_filter("epp", mode, message_timeout)])],
        [
            pool_cluster(),
            static_cluster("epp", epp_port, http2=True, tls=tls, streams_per_connection=streams_per_connection),
        ],
        admin_port,
    )
