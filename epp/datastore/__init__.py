"""The state the hot path reads: the endpoint table (numpy columns indexed by stable slots)."""

from epp.datastore.table import EndpointInfo, EndpointTable, MetricsSample, Snapshot

__all__ = ["EndpointInfo", "EndpointTable", "MetricsSample", "Snapshot"]
