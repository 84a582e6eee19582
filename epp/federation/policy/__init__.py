"""Residency and overflow across federated sites (pure decision code: `now` is an argument, no I/O)."""

from epp.federation.policy.config import (
    HOP_HEADER,
    TIER_HEADER,
    FederationConfig,
    OverflowWeights,
    ResidencyRule,
    SaturationConfig,
    parse_address,
    parse_federation,
)
from epp.federation.policy.overflow import locally_saturated
from epp.federation.policy.residency import UNRESTRICTED, Allowance, allowance_for
from epp.federation.policy.router import FederationRouter, Route, check_fail_open, fail_open_conflicts

__all__ = [
    "HOP_HEADER",
    "TIER_HEADER",
    "UNRESTRICTED",
    "Allowance",
    "FederationConfig",
    "FederationRouter",
    "OverflowWeights",
    "ResidencyRule",
    "Route",
    "SaturationConfig",
    "allowance_for",
    "check_fail_open",
    "fail_open_conflicts",
    "locally_saturated",
    "parse_address",
    "parse_federation",
]
