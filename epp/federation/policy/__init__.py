"""Residency and overflow across federated sites (pure decision code: `now` is an argument, no I/O).

The `federation:` config section they read is `epp.config.federation`; the headers are in `epp.wire`.
"""

from epp.federation.policy.overflow import SaturationConfig, locally_saturated
from epp.federation.policy.residency import UNRESTRICTED, Allowance, allowance_for
from epp.federation.policy.router import FederationRouter, Route, check_fail_open, fail_open_conflicts

__all__ = [
    "UNRESTRICTED",
    "Allowance",
    "FederationRouter",
    "Route",
    "SaturationConfig",
    "allowance_for",
    "check_fail_open",
    "fail_open_conflicts",
    "locally_saturated",
]
