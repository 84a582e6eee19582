"""The heartbeat rule: a FederatedCluster's phase recomputed from its last heartbeat (pure, `now` is an argument)."""

from epp.federation.phase.rule import Deadlines, Phase, PhaseRule

__all__ = ["Deadlines", "Phase", "PhaseRule"]
