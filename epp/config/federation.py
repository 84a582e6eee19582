"""The `federation:` section of the EndpointPickerConfig file, parsed into frozen values.

The decoder (`epp.config.decode`) keeps this section as a raw dict; this parser owns its schema, so every mistake is
reported as a ConfigError naming the file and the field (`federation.residency.rules[2].tiers: …`). The schema
(docs/federation.md has the full example):

    federation:
      staleSites: exclude            # or lastResort: Stale sites only when no Connected site is eligible
      heartbeat: {deliveredCadenceSeconds: 30, maxFutureSkewSeconds: 10}
      sites: {acme-datacenter-1: "127.0.0.1:8081"}    # gateway addresses by FederatedCluster name
      overflow: {weights: {freeGpus: 1, readyServices: 1, failedServices: 1, inflight: 1}}
      residency:
        defaultTiers: [eu-west, eu-central]   # absent: a model no rule names may go anywhere
        rules:
          - name: patient-data
            models: [llama-med]               # exact names
            modelPrefixes: ["eu/"]            # and/or prefixes
            objectives: [critical]            # optional: the rule applies only to these InferenceObjectives
            tiers: [eu-west]
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.errors import ConfigError
from epp.federation.phase import PhaseRule


@dataclass(frozen=True, slots=True)
class ResidencyRule:
    """Traffic for the matching models (and objectives, when listed) may reach only `tiers`."""

    name: str
    tiers: frozenset[str]
    models: frozenset[str] = frozenset()
    model_prefixes: tuple[str, ...] = ()
    objectives: frozenset[str] | None = None  # None: every objective, and requests without one

    def matches(self, model: str, objective: str | None) -> bool:
        if self.objectives is not None and objective not in self.objectives:
            return False
        return model in self.models or any(model.startswith(p) for p in self.model_prefixes)


@dataclass(frozen=True, slots=True)
class OverflowWeights:
    free_gpus: float = 1.0
    ready_services: float = 1.0
    failed_services: float = 1.0
    inflight: float = 1.0


@dataclass(frozen=True, slots=True)
class FederationConfig:
    rules: tuple[ResidencyRule, ...] = ()
    default_tiers: frozenset[str] | None = None  # None: unrestricted
    stale_last_resort: bool = False
    phase_rule: PhaseRule = field(default_factory=PhaseRule)
    site_addresses: Mapping[str, str] = field(default_factory=dict)
    weights: OverflowWeights = field(default_factory=OverflowWeights)


def parse_address(text: object) -> str:
    """A site gateway address must be `ip:port` (IPv6 as `[ip]:port`): Envoy routes to it without DNS.

    Raises ValueError with the reason; returns the canonical "ip:port" the destination header carries.
    """
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(f"must be ip:port, got {text!r}")
    host, _, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"host must be an IP address (no DNS on the routing path), got {host!r}") from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 1-65535, got {port_text!r}")
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{shown}:{int(port_text)}"


class _Fields:
    """Typed readers that raise ConfigError naming `source: path.field`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path}: {why}")

    def mapping(self, value: object, path: str, allowed: frozenset[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, "must be a map")
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise self.fail(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(allowed))})")
        return value

    def number(self, value: object, path: str, default: float, minimum: float = 0.0) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise self.fail(path, f"must be a number, got {value!r}")
        if value < minimum:
            raise self.fail(path, f"must be ≥ {minimum:g}, got {value!r}")
        return float(value)

    def strings(self, value: object, path: str, non_empty: bool = False) -> tuple[str, ...]:
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(path, "must be a list of non-empty strings")
        if non_empty and not value:
            raise self.fail(path, "must list at least one entry")
        return tuple(value)


_TOP = frozenset({"staleSites", "heartbeat", "sites", "overflow", "residency"})
_RULE = frozenset({"name", "models", "modelPrefixes", "objectives", "tiers"})


def parse_federation(raw: object, source: str = "config") -> FederationConfig:
    """Validate the raw `federation:` section (None or absent = no rules, defaults everywhere)."""
    f = _Fields(source)
    top = f.mapping(raw, "federation", _TOP)
    stale = top.get("staleSites", "exclude")
    if stale not in ("exclude", "lastResort"):
        raise f.fail("federation.staleSites", f"must be exclude or lastResort, got {stale!r}")

    hb = f.mapping(
        top.get("heartbeat"), "federation.heartbeat", frozenset({"deliveredCadenceSeconds", "maxFutureSkewSeconds"})
    )
    default_rule = PhaseRule()
    phase_rule = PhaseRule(
        delivered_cadence_s=f.number(
            hb.get("deliveredCadenceSeconds"),
            "federation.heartbeat.deliveredCadenceSeconds",
            default_rule.delivered_cadence_s,
        ),
        max_future_skew_s=f.number(
            hb.get("maxFutureSkewSeconds"), "federation.heartbeat.maxFutureSkewSeconds", default_rule.max_future_skew_s
        ),
    )

    sites_raw = top.get("sites")
    sites_raw = {} if sites_raw is None else sites_raw
    if not isinstance(sites_raw, Mapping):
        raise f.fail("federation.sites", "must map FederatedCluster names to ip:port")
    addresses: dict[str, str] = {}
    for name, address in sites_raw.items():
        try:
            addresses[str(name)] = parse_address(address)
        except ValueError as exc:
            raise f.fail(f"federation.sites.{name}", str(exc)) from None

    overflow = f.mapping(top.get("overflow"), "federation.overflow", frozenset({"weights"}))
    w = f.mapping(
        overflow.get("weights"),
        "federation.overflow.weights",
        frozenset({"freeGpus", "readyServices", "failedServices", "inflight"}),
    )
    d_w = OverflowWeights()
    weights = OverflowWeights(
        free_gpus=f.number(w.get("freeGpus"), "federation.overflow.weights.freeGpus", d_w.free_gpus),
        ready_services=f.number(
            w.get("readyServices"), "federation.overflow.weights.readyServices", d_w.ready_services
        ),
        failed_services=f.number(
            w.get("failedServices"), "federation.overflow.weights.failedServices", d_w.failed_services
        ),
        inflight=f.number(w.get("inflight"), "federation.overflow.weights.inflight", d_w.inflight),
    )

    residency = f.mapping(top.get("residency"), "federation.residency", frozenset({"defaultTiers", "rules"}))
    default_tiers: frozenset[str] | None = None
    if "defaultTiers" in residency:
        default_tiers = frozenset(f.strings(residency["defaultTiers"], "federation.residency.defaultTiers"))
    rules_raw = residency.get("rules", [])
    rules_raw = [] if rules_raw is None else rules_raw
    if not isinstance(rules_raw, list):
        raise f.fail("federation.residency.rules", "must be a list")
    rules: list[ResidencyRule] = []
    for i, entry in enumerate(rules_raw):
        path = f"federation.residency.rules[{i}]"
        rule = f.mapping(entry, path, _RULE)
        name = rule.get("name")
        if not isinstance(name, str) or not name:
            raise f.fail(f"{path}.name", "is missing")
        if any(r.name == name for r in rules):
            raise f.fail(f"{path}.name", f"{name!r} is used by an earlier rule")
        models = f.strings(rule.get("models"), f"{path}.models")
        prefixes = f.strings(rule.get("modelPrefixes"), f"{path}.modelPrefixes")
        if not models and not prefixes:
            raise f.fail(path, "must name models or modelPrefixes (a rule that matches nothing protects nothing)")
        objectives = None
        if "objectives" in rule:
            objectives = frozenset(f.strings(rule["objectives"], f"{path}.objectives", non_empty=True))
        if "tiers" not in rule:
            raise f.fail(f"{path}.tiers", "is missing (list the tiers this traffic may reach)")
        tiers = frozenset(f.strings(rule["tiers"], f"{path}.tiers"))
        rules.append(
            ResidencyRule(
                name=name,
                tiers=tiers,
                models=frozenset(models),
                model_prefixes=prefixes,
                objectives=objectives,
            )
        )
    return FederationConfig(
        rules=tuple(rules),
        default_tiers=default_tiers,
        stale_last_resort=stale == "lastResort",
        phase_rule=phase_rule,
        site_addresses=addresses,
        weights=weights,
    )
