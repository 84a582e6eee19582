"""FederatedCluster objects into the sites registry (feeder layer: the list/watch is the composition root's)."""

from epp.federation.watch.feed import (
    GATEWAY_ADDRESS_ANNOTATION,
    GROUP,
    PLURAL,
    VERSION,
    SiteFeed,
    parse_timestamp,
    site_from_object,
)

__all__ = [
    "GATEWAY_ADDRESS_ANNOTATION",
    "GROUP",
    "PLURAL",
    "VERSION",
    "SiteFeed",
    "parse_timestamp",
    "site_from_object",
]
