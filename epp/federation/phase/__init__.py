"""The heartbeat rule: a FederatedCluster's phase recomputed from its last heartbeat (pure, `now` is an argument)."""

from epp.federation.phase.rule import Phase, PhaseRule

__all__ = ["Phase", "PhaseRule"]
