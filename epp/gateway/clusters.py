"""The two upstream clusters: the picker (ext_proc over HTTP/2) and the pool the requests go to.

The pool cluster never reads a client header to choose its host:
- with the pool's members known (a static list or a headless Service), it uses Envoy's `override_host` policy,
  which reads the picker's choice from dynamic metadata `envoy.lb` (a comma list: the rest are tried on retry)
  and only selects members of the cluster; without a choice (the picker down under FailOpen) it falls back to
  round robin over the pool — the FailOpen fallback;
- without them (FailClose only) it is an ORIGINAL_DST cluster keyed on the same metadata, so the picker's first
  choice is used as is, and no choice means no host.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, extension_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.metadata.v3 import metadata_pb2
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message

from epp import wire
from epp.gateway.options import GatewayOptions, HostPort

EPP_CLUSTER = "epp"
POOL_CLUSTER = "pool"
_CONNECT_TIMEOUT_S = 0.25  # loopback/cluster-local: a dead peer refuses at once; a black hole should fail fast
_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def packed(message: Message) -> any_pb2.Any:
    """A typed_config: the message packed into Any (its type URL is what Envoy dispatches on)."""
    value = any_pb2.Any()
    value.Pack(message)
    return value


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(round(seconds * 1e9))
    return value


def socket_address(where: HostPort) -> address_pb2.Address:
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=where.host, port_value=where.port))


def _load_assignment(name: str, members: list[HostPort]) -> endpoint_pb2.ClusterLoadAssignment:
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=name,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                lb_endpoints=[
                    endpoint_components_pb2.LbEndpoint(
                        endpoint=endpoint_components_pb2.Endpoint(address=socket_address(member))
                    )
                    for member in members
                ]
            )
        ],
    )


def _dns_or_static(cluster: cluster_pb2.Cluster, hosts: list[HostPort], refresh_s: float) -> None:
    if all(h.is_ip for h in hosts):
        cluster.type = cluster_pb2.Cluster.STATIC
        return
    cluster.type = cluster_pb2.Cluster.STRICT_DNS
    cluster.dns_refresh_rate.CopyFrom(duration(refresh_s))


def upstream_tls(sni: str) -> base_pb2.TransportSocket:
    """TLS to the picker, as kgateway and Envoy AI Gateway dial it: ALPN h2, SNI set, the certificate not verified.

    The picker serves TLS by default with a certificate it makes at start (or one mounted with --cert-path), which
    no gateway can verify without a CA to trust; the connection is encrypted, not authenticated. An operator with a
    CA adds `validation_context` to this transport socket.
    """
    context = tls_pb2.UpstreamTlsContext(sni=sni, common_tls_context=tls_pb2.CommonTlsContext(alpn_protocols=["h2"]))
    return base_pb2.TransportSocket(name="envoy.transport_sockets.tls", typed_config=packed(context))


def epp_cluster(options: GatewayOptions) -> cluster_pb2.Cluster:
    """The picker: gRPC needs HTTP/2, over TLS unless the picker runs with --secure-serving=false; a DNS name
    (a Service) is resolved and followed."""
    http2 = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(http2_protocol_options={})
    )
    if options.epp_streams_per_connection:
        http2.common_http_protocol_options.max_requests_per_connection.value = options.epp_streams_per_connection
    cluster = cluster_pb2.Cluster(
        name=EPP_CLUSTER,
        connect_timeout=duration(_CONNECT_TIMEOUT_S),
        load_assignment=_load_assignment(EPP_CLUSTER, [options.epp]),
    )
    cluster.typed_extension_protocol_options[_HTTP_OPTIONS_KEY].CopyFrom(packed(http2))
    _dns_or_static(cluster, [options.epp], options.dns_refresh_s)
    if options.epp_tls:
        cluster.transport_socket.CopyFrom(upstream_tls(options.epp_sni))
    return cluster


def _destination_metadata_key() -> metadata_pb2.MetadataKey:
    return metadata_pb2.MetadataKey(
        key=wire.LB_NAMESPACE, path=[metadata_pb2.MetadataKey.PathSegment(key=wire.DESTINATION_HEADER)]
    )


def _override_host_policy() -> cluster_pb2.LoadBalancingPolicy:
    round_robin = cluster_pb2.LoadBalancingPolicy(
        policies=[
            cluster_pb2.LoadBalancingPolicy.Policy(
                typed_extension_config=extension_pb2.TypedExtensionConfig(
                    name="envoy.load_balancing_policies.round_robin", typed_config=packed(round_robin_pb2.RoundRobin())
                )
            )
        ]
    )
    override = override_host_pb2.OverrideHost(
        # Metadata only: a header source would let a client choose its destination whenever the picker is down.
        override_host_sources=[override_host_pb2.OverrideHost.OverrideHostSource(metadata=_destination_metadata_key())],
        fallback_policy=round_robin,
    )
    return cluster_pb2.LoadBalancingPolicy(
        policies=[
            cluster_pb2.LoadBalancingPolicy.Policy(
                typed_extension_config=extension_pb2.TypedExtensionConfig(
                    name="envoy.load_balancing_policies.override_host", typed_config=packed(override)
                )
            )
        ]
    )


def pool_members(options: GatewayOptions) -> list[HostPort]:
    """Static IPs as given, or the headless Service name once per target port (each resolves to all pod IPs)."""
    if options.endpoints:
        return list(options.endpoints)
    if options.endpoints_dns:
        return [HostPort(options.endpoints_dns, port) for port in options.pool.target_ports]
    return []


def pool_cluster(options: GatewayOptions) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(name=POOL_CLUSTER, connect_timeout=duration(_CONNECT_TIMEOUT_S))
    members = pool_members(options)
    if members:
        cluster.load_assignment.CopyFrom(_load_assignment(POOL_CLUSTER, members))
        _dns_or_static(cluster, members, options.dns_refresh_s)
        cluster.load_balancing_policy.CopyFrom(_override_host_policy())
    else:
        cluster.type = cluster_pb2.Cluster.ORIGINAL_DST
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        cluster.original_dst_lb_config.metadata_key.CopyFrom(_destination_metadata_key())
    return cluster
