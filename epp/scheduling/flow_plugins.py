"""Flow-control plugin types for the registry (upstream's names and parameters), and phase two of the
`flowControl:` section: the controller's settings, the pool's dispatch detector and the admitters.

The section itself is decoded in `epp.config.flowcontrol`; here its plugin references become objects. A fairness
policy keeps state per band (a round-robin cursor, LAS service), so its plugin is a template: each band gets its
own instance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from epp.config.flowcontrol import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    DEFAULT_USAGE_LIMIT_POLICY,
    FlowControlSpec,
)
from epp.config.model import SaturationThresholds
from epp.errors import ConfigError
from epp.flowcontrol import FlowSettings
from epp.flowcontrol import policies as fp
from epp.flowcontrol.admission import Admitter, ProbabilisticAdmitter
from epp.scheduling.knee import KneeDetector
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext
from epp.scheduling.saturation import CONCURRENCY_MODES, ConcurrencyDetector, SaturationDetector


@dataclass(frozen=True, slots=True)
class FlowPolicy:
    """A flow-control policy plugin: `make()` builds one policy object (one per band for fairness)."""

    type_name: str
    name: str
    role: str  # "fairness" | "ordering" | "usage-limit"
    make: Callable[[], object]


def fairness(type_name: str, name: str, params: Params) -> FlowPolicy:
    if type_name == "program-aware-fairness":
        strategy = params.text("strategy", "las")
        if strategy != "las":
            raise params.error("strategy", f"'{strategy}': only 'las' is supported")
        w_service = params.number("lasWeightService", 0.8, minimum=0)
        w_wait = params.number("lasWeightHeadWait", 0.2, minimum=0)
        half_life = params.number("lasHalfLifeSeconds", 60.0, minimum=0)
        params.number("evictionTtlSeconds", 3600.0, minimum=0)  # idle flows leave no state here (accepted)
        params.number("evictionSweepSeconds", 300.0, minimum=1e-9)
        params.finish()
        return FlowPolicy(type_name, name, "fairness", lambda: fp.LasFairness(w_service, w_wait, half_life))
    if type_name == "round-robin-fairness-policy":
        # ours: the fair-share gate (docs/flow-control.md); 1.0, the default, is upstream's plain round-robin
        over_share = params.number("overShareCeiling", 1.0, minimum=1e-9, maximum=1.0)
        share_half_life = params.number("shareHalfLifeSeconds", 10.0, minimum=1e-9)
        params.finish()
        return FlowPolicy(type_name, name, "fairness", lambda: fp.RoundRobinFairness(over_share, share_half_life))
    params.finish()
    return FlowPolicy(type_name, name, "fairness", fp.GlobalStrictFairness)


def ordering(type_name: str, name: str, params: Params) -> FlowPolicy:
    params.finish()
    return FlowPolicy(type_name, name, "ordering", lambda: fp.ordering_policy(type_name))


def usage_limit(type_name: str, name: str, params: Params) -> FlowPolicy:
    if type_name == "static-usage-limit-policy":
        threshold = params.number("threshold", 1.0, minimum=1e-9, maximum=1.0)
        params.finish()
        return FlowPolicy(type_name, name, "usage-limit", lambda: fp.StaticUsageLimit(threshold))
    if type_name == "priority-holdback-policy":
        shape = params.text("shape", "linear")
        if shape != "linear":
            raise params.error("shape", f"'{shape}': only 'linear' is supported")
        domain = params.text("domain", "rank")
        if domain not in ("rank", "value"):
            raise params.error("domain", f"'{domain}': expected 'rank' or 'value'")
        if not params.given("minCeiling"):
            raise params.error("minCeiling", "required: the ceiling of the lowest priority, in [0, 1)")
        low = params.number("minCeiling", 0.0, minimum=0, maximum=0.999999)
        high = params.number("maxCeiling", 1.0, minimum=1e-9, maximum=1.0)
        params.finish()
        return FlowPolicy(
            type_name, name, "usage-limit", lambda: fp.PriorityHoldback(low, high, by_value=domain == "value")
        )
    params.finish()
    return FlowPolicy(type_name, name, "usage-limit", fp.SoftReflectiveCeiling)


def eviction_policy(type_name: str, name: str, params: Params) -> FlowPolicy:
    """`sheddable-eviction-filter`, `priority-then-time-eviction-order-policy`: upstream registers them but wires
    them itself whenever `enableEviction` is on, so listing them changes nothing; accepted for upstream's files
    (the rules are `epp.flowcontrol.eviction`'s)."""
    params.finish()
    return FlowPolicy(type_name, name, "eviction", lambda: None)


def concurrency_detector(name: str, params: Params) -> ConcurrencyDetector:
    mode = params.text("concurrencyMode", "requests")
    if mode not in CONCURRENCY_MODES:
        raise params.error("concurrencyMode", f"'{mode}': expected requests, tokens or hybrid")
    limit = params.integer("maxConcurrency", 100, minimum=1)
    token_limit = params.integer("maxTokenConcurrency", 1_000_000, minimum=1)
    headroom = params.number("headroom", 0.0, minimum=0)
    # upstream reads the tallies from a named inflight-load-producer; ours come from the endpoint table, which every
    # inflight-load-producer reads too, so the name changes nothing (accepted for upstream's files)
    params.text("inFlightLoadProducerName", "")
    params.finish()
    return ConcurrencyDetector(name, limit, headroom, mode, token_limit)


def self_calibrating_detector(name: str, params: Params, ctx: BuildContext) -> KneeDetector:
    """Ours: no parameter to tune (its rules and constants: `epp.scheduling.knee`); the pool's staleness rule."""
    params.finish()
    return KneeDetector(name, ctx.freshness)


def probabilistic_admitter(name: str, params: Params) -> object:
    thresholds = SaturationThresholds(
        queue_depth=params.number("queueDepthThreshold", 5.0, minimum=1e-9),
        kv_util=params.number("kvCacheUtilThreshold", 0.8, minimum=1e-9, maximum=1.0),
    )
    power = params.number("power", 5.0, minimum=1e-9)
    k = params.number("k", 300.0, minimum=1e-9)
    params.finish()
    return ProbabilisticAdmitter(SaturationDetector(thresholds), power=power, k=k, name=name)


def flow_settings(spec_source: str, flow: FlowControlSpec, policies: dict[str, FlowPolicy]) -> FlowSettings:
    """The controller's settings from the decoded section and the built policy plugins (by name)."""

    def policy(ref: str, role: str, default: str, where: str) -> Callable[[], object]:
        plugin = policies.get(ref)
        if plugin is None:
            if ref == default:  # upstream adds the default policy itself
                return _DEFAULTS[default]
            raise ConfigError(f"{spec_source}: flowControl.{where}: plugin '{ref}' is not a flow-control policy")
        if plugin.role != role:
            raise ConfigError(
                f"{spec_source}: flowControl.{where}: plugin '{ref}' ({plugin.type_name}) is a {plugin.role} "
                f"policy, not a {role} policy"
            )
        return plugin.make

    bands = [("defaultPriorityBand", flow.default_band)]
    if flow.default_negative_band is not None:
        bands.append(("defaultNegativePriorityBand", flow.default_negative_band))
    bands += [(f"priorityBands[{i}]", b) for i, b in enumerate(flow.bands)]
    fairness_of: dict[str, Callable[[], object]] = {}
    ordering_of: dict[str, Callable[[], object]] = {}
    for where, band in bands:
        fairness_of[band.fairness_policy_ref] = policy(
            band.fairness_policy_ref, "fairness", DEFAULT_FAIRNESS_POLICY, f"{where}.fairnessPolicyRef"
        )
        ordering_of[band.ordering_policy_ref] = policy(
            band.ordering_policy_ref, "ordering", DEFAULT_ORDERING_POLICY, f"{where}.orderingPolicyRef"
        )
    usage = policy(flow.usage_limit_policy_ref, "usage-limit", DEFAULT_USAGE_LIMIT_POLICY, "usageLimitPolicyPluginRef")
    return FlowSettings(
        spec=flow,
        usage_limit=usage(),  # type: ignore[arg-type]
        fairness=lambda ref: cast(fp.FairnessPolicy, fairness_of[ref]()),
        ordering=lambda ref: cast(fp.OrderingPolicy, ordering_of[ref]()),
    )


_DEFAULTS: dict[str, Callable[[], object]] = {
    DEFAULT_FAIRNESS_POLICY: fp.GlobalStrictFairness,
    DEFAULT_ORDERING_POLICY: fp.FcfsOrdering,
    DEFAULT_USAGE_LIMIT_POLICY: fp.StaticUsageLimit,
}

__all__ = ["Admitter", "FlowPolicy", "flow_settings"]
