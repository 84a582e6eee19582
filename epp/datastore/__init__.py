"""The state the hot path reads: the endpoint table (numpy columns indexed by stable slots) and the one rule for
when its scraped data is usable."""

from epp.datastore.freshness import Freshness, usable, usable_slots
from epp.datastore.table import EndpointInfo, EndpointTable, MetricsSample, Snapshot

__all__ = ["EndpointInfo", "EndpointTable", "Freshness", "MetricsSample", "Snapshot", "usable", "usable_slots"]
