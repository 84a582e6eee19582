"""The `flowControl:` section, decoded and validated to upstream's schema (llm-d-router
`apix/config/v1alpha1/endpointpickerconfig_types.go`, `FlowControlConfig` and `PriorityBandConfig`).

The section is only honoured with the `flowControl` feature gate on; off, upstream warns that everything but
`saturationDetector` is ignored, and so do we (`epp.config.decode`). Decoding it either way means a file with a typo
in a band is refused before the gate is flipped, not after. Defaults are upstream's: TTL 60s (the no-endpoint TTL
follows it when unset), global caps unlimited (0), per-band caps 1 GB and 5000 requests (0 means the default),
policies `global-strict-fairness-policy` and `fcfs-ordering-policy`, usage limit `static-usage-limit-policy`,
detector `utilization-detector`, eviction off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.config.durations import parse_duration
from epp.config.quantity import parse_quantity
from epp.errors import ConfigError

DEFAULT_REQUEST_TTL_S = 60.0
DEFAULT_BAND_MAX_BYTES = 1_000_000_000
DEFAULT_BAND_MAX_REQUESTS = 5000
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"
DEFAULT_SATURATION_DETECTOR = "utilization-detector"

_FIELDS = frozenset(
    {
        "maxBytes",
        "maxRequests",
        "defaultRequestTTL",
        "noEndpointRequestTTL",
        "defaultPriorityBand",
        "defaultNegativePriorityBand",
        "priorityBands",
        "usageLimitPolicyPluginRef",
        "saturationDetector",
        "enableEviction",
    }
)
_BAND_FIELDS = frozenset({"priority", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef"})


@dataclass(frozen=True, slots=True)
class PriorityBandSpec:
    """One band (or a band template, where `priority` is unused). Caps: 0 in the file means the default."""

    priority: int = 0
    max_bytes: int = DEFAULT_BAND_MAX_BYTES
    max_requests: int = DEFAULT_BAND_MAX_REQUESTS
    fairness_policy_ref: str = DEFAULT_FAIRNESS_POLICY
    ordering_policy_ref: str = DEFAULT_ORDERING_POLICY


@dataclass(frozen=True, slots=True)
class FlowControlSpec:
    """The section with upstream's defaults filled; `configured` lists the settings the file gave."""

    max_bytes: int = 0  # 0: unlimited
    max_requests: int = 0  # 0: unlimited
    default_request_ttl_s: float = DEFAULT_REQUEST_TTL_S  # 0: no expiry
    no_endpoint_request_ttl_s: float = DEFAULT_REQUEST_TTL_S  # follows default_request_ttl_s when unset
    default_band: PriorityBandSpec = PriorityBandSpec()
    default_negative_band: PriorityBandSpec | None = None  # None: negative priorities use default_band
    bands: tuple[PriorityBandSpec, ...] = ()
    usage_limit_policy_ref: str = DEFAULT_USAGE_LIMIT_POLICY
    saturation_detector_ref: str | None = None
    enable_eviction: bool = False
    configured: frozenset[str] = frozenset()

    @property
    def ignored_without_gate(self) -> tuple[str, ...]:
        """The settings that do nothing while the gate is off (all but saturationDetector), sorted."""
        return tuple(sorted(self.configured - {"saturationDetector"}))


def _fail(source: str, where: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: flowControl.{where}: {why}")


def _ref(value: object, source: str, where: str, plugin_names: set[str], default: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, where, f"expected a plugin name, got {value!r}")
    if value not in plugin_names and value != default:  # upstream adds the default policy itself
        raise _fail(source, where, f"pluginRef '{value}' names no entry of 'plugins'")
    return value


def _quantity(value: object, source: str, where: str, default: int) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise _fail(source, where, str(exc)) from None
    return amount or default


def _band(raw: object, source: str, where: str, plugin_names: set[str], template: bool) -> PriorityBandSpec:
    if not isinstance(raw, Mapping):
        raise _fail(source, where, f"expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _BAND_FIELDS
    if unknown:
        raise _fail(source, where, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    priority = raw.get("priority", 0)
    if not template and "priority" not in raw:
        raise _fail(source, where, "priority is required")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _fail(source, f"{where}.priority", f"expected an integer, got {priority!r}")
    return PriorityBandSpec(
        priority=priority,
        max_bytes=_quantity(raw.get("maxBytes", 0), source, f"{where}.maxBytes", DEFAULT_BAND_MAX_BYTES),
        max_requests=_quantity(raw.get("maxRequests", 0), source, f"{where}.maxRequests", DEFAULT_BAND_MAX_REQUESTS),
        fairness_policy_ref=_ref(
            raw.get("fairnessPolicyRef", DEFAULT_FAIRNESS_POLICY),
            source,
            f"{where}.fairnessPolicyRef",
            plugin_names,
            DEFAULT_FAIRNESS_POLICY,
        ),
        ordering_policy_ref=_ref(
            raw.get("orderingPolicyRef", DEFAULT_ORDERING_POLICY),
            source,
            f"{where}.orderingPolicyRef",
            plugin_names,
            DEFAULT_ORDERING_POLICY,
        ),
    )


def _ttl(raw: Mapping[str, Any], key: str, source: str) -> float | None:
    if raw.get(key) is None:
        return None
    try:
        return parse_duration(raw[key])
    except ValueError as exc:
        raise _fail(source, key, str(exc)) from None


def parse_flow_control(raw: object, source: str, plugin_names: set[str]) -> FlowControlSpec:
    """Decode the section; raises ConfigError naming the file and the field."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: flowControl: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ConfigError(f"{source}: flowControl: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    configured = frozenset(str(k) for k, v in raw.items() if v is not None)
    ttl = _ttl(raw, "defaultRequestTTL", source)
    no_endpoint_ttl = _ttl(raw, "noEndpointRequestTTL", source)
    default_ttl = DEFAULT_REQUEST_TTL_S if ttl is None else ttl
    bands: list[PriorityBandSpec] = []
    seen: set[int] = set()
    band_list = raw.get("priorityBands") or []
    if not isinstance(band_list, list):
        raise _fail(source, "priorityBands", f"expected a list, got {type(band_list).__name__}")
    for i, item in enumerate(band_list):
        band = _band(item, source, f"priorityBands[{i}]", plugin_names, template=False)
        if band.priority in seen:
            raise _fail(source, f"priorityBands[{i}]", f"priority {band.priority} is configured twice")
        seen.add(band.priority)
        bands.append(band)
    detector = raw.get("saturationDetector")
    detector_ref = None
    if detector is not None:
        if not isinstance(detector, Mapping) or set(detector) - {"pluginRef"}:
            raise _fail(source, "saturationDetector", "expected a mapping with only 'pluginRef'")
        detector_ref = _ref(
            detector.get("pluginRef"), source, "saturationDetector.pluginRef", plugin_names, DEFAULT_SATURATION_DETECTOR
        )
    eviction = raw.get("enableEviction", False)
    if not isinstance(eviction, bool):
        raise _fail(source, "enableEviction", f"expected true or false, got {eviction!r}")
    negative = raw.get("defaultNegativePriorityBand")
    return FlowControlSpec(
        max_bytes=_quantity(raw.get("maxBytes", 0), source, "maxBytes", 0),
        max_requests=_quantity(raw.get("maxRequests", 0), source, "maxRequests", 0),
        default_request_ttl_s=default_ttl,
        no_endpoint_request_ttl_s=default_ttl if no_endpoint_ttl is None else no_endpoint_ttl,
        default_band=(
            _band(raw["defaultPriorityBand"], source, "defaultPriorityBand", plugin_names, template=True)
            if raw.get("defaultPriorityBand") is not None
            else PriorityBandSpec()
        ),
        default_negative_band=(
            _band(negative, source, "defaultNegativePriorityBand", plugin_names, template=True)
            if negative is not None
            else None
        ),
        bands=tuple(bands),
        usage_limit_policy_ref=(
            _ref(
                raw["usageLimitPolicyPluginRef"],
                source,
                "usageLimitPolicyPluginRef",
                plugin_names,
                DEFAULT_USAGE_LIMIT_POLICY,
            )
            if raw.get("usageLimitPolicyPluginRef")
            else DEFAULT_USAGE_LIMIT_POLICY
        ),
        saturation_detector_ref=detector_ref,
        enable_eviction=eviction,
        configured=configured,
    )
