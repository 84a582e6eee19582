"""The demo's Envoy: the production bootstrap for the pool, plus one plain round-robin listener to compare with.

The picker's listener is exactly what `epp envoy-config` renders (ext_proc to the picker, the override_host pool
cluster, FailClose routing), so the demo measures the configuration an operator deploys, not a test rig. The
comparison listener is what a user runs without a picker: Envoy's round robin over the same endpoints, nothing
else. Both live in one Envoy process, so both pay the same proxy costs on the same worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datastore.pool import FailureMode, PoolSpec
from epp.gateway import GatewayOptions, HostPort, bootstrap_dict, parse_endpoint_list
from epp.gateway.testbed import listener

ROUND_ROBIN_CLUSTER = "round-robin"
LOOPBACK = "127.0.0.1"


def round_robin_cluster(endpoints: Sequence[HostPort], name: str = ROUND_ROBIN_CLUSTER) -> dict[str, Any]:
    """Envoy's ROUND_ROBIN over static endpoints: the baseline that needs no picker."""
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "0.25s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": e.host, "port_value": e.port}}}}
                        for e in endpoints
                    ]
                }
            ],
        },
    }


def demo_bootstrap(
    endpoints: Sequence[str], epp_port: int, picker_port: int, round_robin_port: int, admin_port: int
) -> dict[str, Any]:
    """Two listeners on loopback: `picker_port` goes through the picker, `round_robin_port` straight to the pool."""
    members = parse_endpoint_list(",".join(endpoints), "pool endpoints")
    options = GatewayOptions(
        pool=PoolSpec(name="demo", failure_mode=FailureMode.FAIL_CLOSE),
        epp=HostPort(LOOPBACK, epp_port),
        listen=HostPort(LOOPBACK, picker_port),
        admin=HostPort(LOOPBACK, admin_port),
        endpoints=members,
    )
    config = bootstrap_dict(options)
    resources = config["static_resources"]
    # No route timeout: a long generation is legitimate, as on the picker's listener.
    route = {"route": {"cluster": ROUND_ROBIN_CLUSTER, "timeout": "0s"}}
    resources["listeners"].append(listener("round-robin", round_robin_port, route, []))
    resources["clusters"].append(round_robin_cluster(members))
    return config
