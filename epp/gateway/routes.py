"""Routes: every request goes to the pool cluster, whose load balancer follows the picker's metadata.

FailClose adds one rule in front: a request reaches the pool only if the picker decided (its header is present;
a client's copy was already removed before any filter ran), anything else gets a 503 from Envoy. Routes are
matched again after the picker answers (it clears the route cache), so the rule sees the decision.

Retries walk the picker's fallback list: the override_host policy takes the next address of the comma list on
each retry, and `previous_hosts` keeps the fallback round robin from choosing a host that just failed. Only
failures where nothing reached the model server are retried (connect failure, refused stream, reset before the
request went out): generating twice costs GPU time and may differ.
"""

from __future__ import annotations

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2

from epp import wire
from epp.datastore.pool import FailureMode, PoolSpec
from epp.gateway.clusters import POOL_CLUSTER, duration, packed
from epp.gateway.options import GatewayOptions

ROUTE_CONFIG = "inference"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"  # the HCM's name for the filter, which per-route configs key on
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
NO_DECISION_BODY = "inference error: ServiceUnavailable - the endpoint picker made no decision"


def _retry_policy(options: GatewayOptions) -> route_components_pb2.RetryPolicy:
    policy = route_components_pb2.RetryPolicy(retry_on=RETRY_ON, host_selection_retry_max_attempts=3)
    policy.num_retries.value = options.retries
    policy.retry_host_predicate.append(
        route_components_pb2.RetryPolicy.RetryHostPredicate(
            name="envoy.retry_host_predicates.previous_hosts",
            typed_config=packed(previous_hosts_pb2.PreviousHostsPredicate()),
        )
    )
    return policy


def _to_pool(options: GatewayOptions) -> route_components_pb2.RouteAction:
    return route_components_pb2.RouteAction(
        cluster=POOL_CLUSTER,
        # No overall deadline: a long generation is legitimate; idle streams are ended by the HCM's idle timeout.
        timeout=duration(0),
        retry_policy=_retry_policy(options),
    )


def route_configuration(options: GatewayOptions) -> route_pb2.RouteConfiguration:
    if options.more_pools:
        return route_pb2.RouteConfiguration(
            name=ROUTE_CONFIG, virtual_hosts=[_pool_host(options, pool) for pool in options.pools]
        )
    return route_pb2.RouteConfiguration(
        name=ROUTE_CONFIG,
        virtual_hosts=[
            route_components_pb2.VirtualHost(
                name=options.pool.name, domains=["*"], routes=_routes(options, options.fail_open)
            )
        ],
    )


def _pool_host(options: GatewayOptions, pool: PoolSpec) -> route_components_pb2.VirtualHost:
    """One pool of several: requests for the host `<pool name>` go through its routes, each of which tells the
    picker the pool in the ext_proc stream's gRPC metadata (set by the route: a client cannot choose it) and
    gives the filter the pool's failure mode."""
    fail_open = pool.failure_mode is FailureMode.FAIL_OPEN
    overrides = ext_proc_pb2.ExtProcOverrides(
        grpc_initial_metadata=[base_pb2.HeaderValue(key=wire.POOL_METADATA, value=f"{pool.namespace}/{pool.name}")]
    )
    overrides.failure_mode_allow.value = fail_open
    # On the virtual host, so every route of it has it: the ext_proc filter reads the per-route config of the
    # route matched when the request starts, which under FailClose is the `undecided` one (no decision header yet).
    host = route_components_pb2.VirtualHost(
        name=pool.name, domains=[pool.name, f"{pool.name}:*"], routes=_routes(options, fail_open)
    )
    host.typed_per_filter_config[EXT_PROC_FILTER].CopyFrom(packed(ext_proc_pb2.ExtProcPerRoute(overrides=overrides)))
    return host


def _routes(options: GatewayOptions, fail_open: bool) -> list[route_components_pb2.Route]:
    everything = route_components_pb2.RouteMatch(prefix="/")
    routes: list[route_components_pb2.Route] = []
    if fail_open:
        routes.append(route_components_pb2.Route(name="pool", match=everything, route=_to_pool(options)))
    else:
        decided = route_components_pb2.RouteMatch(
            prefix="/",
            headers=[route_components_pb2.HeaderMatcher(name=wire.DESTINATION_HEADER, present_match=True)],
        )
        routes.append(route_components_pb2.Route(name="decided", match=decided, route=_to_pool(options)))
        routes.append(
            route_components_pb2.Route(
                name="undecided",
                match=everything,
                direct_response=route_components_pb2.DirectResponseAction(
                    status=503, body=base_pb2.DataSource(inline_string=NO_DECISION_BODY)
                ),
            )
        )
    return routes


def strip_routing_headers() -> extension_pb2.TypedExtensionConfig:
    """An early header mutation: runs before route selection and before any filter, so neither the picker nor
    the route ever sees a client's `x-gateway-destination-endpoint*` (a route's request_headers_to_remove is
    applied by the router, after ext_proc — too late)."""
    mutation = header_mutation_pb2.HeaderMutation(
        mutations=[mutation_rules_pb2.HeaderMutation(remove=name) for name in wire.ROUTING_HEADERS]
    )
    return extension_pb2.TypedExtensionConfig(
        name="envoy.http.early_header_mutation.header_mutation", typed_config=packed(mutation)
    )
