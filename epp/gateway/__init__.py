"""epp.gateway: the gateway side of the protocol — Envoy bootstraps rendered for a pool, and where Envoy is."""

from epp.gateway.bootstrap import bootstrap_dict, build_bootstrap, render_yaml
from epp.gateway.options import BodyMode, GatewayOptions, HostPort, ResponsePhases, parse_endpoint_list, parse_host_port

__all__ = [
    "BodyMode",
    "GatewayOptions",
    "HostPort",
    "ResponsePhases",
    "bootstrap_dict",
    "build_bootstrap",
    "parse_endpoint_list",
    "parse_host_port",
    "render_yaml",
]
