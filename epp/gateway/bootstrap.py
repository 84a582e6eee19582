"""A complete Envoy bootstrap for one InferencePool, built as typed protobuf messages and rendered to YAML.

Typed messages (the same Envoy API stubs the picker serves with) instead of string templates: a misspelt field
fails here, at build time, and every typed_config carries the exact type URL Envoy dispatches on.
"""

from __future__ import annotations

from typing import Any

import yaml
from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import substitution_format_string_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from google.protobuf import json_format

from epp.gateway.clusters import epp_cluster, packed, pool_cluster, socket_address
from epp.gateway.extproc_filter import extproc_filter
from epp.gateway.options import BodyMode, GatewayOptions
from epp.gateway.routes import route_configuration, strip_routing_headers

_Hcm = http_connection_manager_pb2.HttpConnectionManager


# What an operator (and the failure-mode tests) need to see where a request went and why: the upstream host is
# empty (null) when nothing was sent to a backend; the flags say why (e.g. UAEX: refused by the picker's failure).
ACCESS_LOG_FIELDS = {
    "start": "%START_TIME%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(:PATH)%",
    "authority": "%REQ(:AUTHORITY)%",  # with several pools, the host names the pool (its virtual host)
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "upstream_host": "%UPSTREAM_HOST%",
    "picked": "%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint)%",
    "duration_ms": "%DURATION%",
}


def _access_log(path: str) -> accesslog_pb2.AccessLog:
    log_format = substitution_format_string_pb2.SubstitutionFormatString()
    log_format.json_format.update(ACCESS_LOG_FIELDS)
    return accesslog_pb2.AccessLog(
        name="envoy.access_loggers.file", typed_config=packed(file_pb2.FileAccessLog(path=path, log_format=log_format))
    )


def _connection_manager(options: GatewayOptions) -> http_connection_manager_pb2.HttpConnectionManager:
    manager = _Hcm(
        stat_prefix="inference",
        codec_type=_Hcm.AUTO,
        early_header_mutation_extensions=[strip_routing_headers()],
        route_config=route_configuration(options),
        http_filters=[
            http_connection_manager_pb2.HttpFilter(
                name="envoy.filters.http.ext_proc", typed_config=packed(extproc_filter(options))
            ),
            http_connection_manager_pb2.HttpFilter(
                name="envoy.filters.http.router", typed_config=packed(router_pb2.Router())
            ),
        ],
    )
    if options.access_log:
        manager.access_log.append(_access_log(options.access_log))
    return manager


def _listener(options: GatewayOptions) -> listener_pb2.Listener:
    listener = listener_pb2.Listener(
        name="inference",
        address=socket_address(options.listen),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=packed(_connection_manager(options)),
                    )
                ]
            )
        ],
    )
    if options.body_mode is BodyMode.BUFFERED:
        # BUFFERED holds the whole body in Envoy; above this limit Envoy answers 413 itself. Match the picker's
        # --max-body-bytes so the two agree on what "too large" means.
        listener.per_connection_buffer_limit_bytes.value = options.max_body_bytes
    return listener


def build_bootstrap(options: GatewayOptions) -> bootstrap_pb2.Bootstrap:
    return bootstrap_pb2.Bootstrap(
        admin=bootstrap_pb2.Admin(address=socket_address(options.admin)),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            listeners=[_listener(options)],
            clusters=[epp_cluster(options), pool_cluster(options)],
        ),
    )


def bootstrap_dict(options: GatewayOptions) -> dict[str, Any]:
    """The bootstrap as plain data, proto field names (as in Envoy's docs), defaults left out."""
    plain: dict[str, Any] = _plain(
        json_format.MessageToDict(build_bootstrap(options), preserving_proto_field_name=True)
    )
    return plain


def _plain(value: Any) -> Any:
    """json_format returns OrderedDicts for Any fields; yaml.safe_dump wants plain dicts (order is kept)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def render_yaml(options: GatewayOptions) -> str:
    if options.more_pools:
        pools = "s " + ", ".join(f"{p.namespace}/{p.name} ({p.failure_mode.value})" for p in options.pools)
    else:
        pools = f" {options.pool.namespace}/{options.pool.name}: {options.pool.failure_mode.value},"
    header = (
        f"# Envoy bootstrap for InferencePool{pools} "
        f"request body {options.body_mode.value}, "
        f"response phases to the picker: {options.response_phases.value}.\n"
        "# Generated by `epp envoy-config`; see docs/failure-modes.md.\n"
    )
    return header + yaml.safe_dump(bootstrap_dict(options), sort_keys=False, default_flow_style=False, width=1000)
