"""Which tiers a request's traffic may reach: the residency rules, then the client's narrowing header.

Every rule that matches a request applies, and the allowed tiers are the intersection of theirs: adding a rule can
only narrow what a model may reach, never widen it, whatever the order of the rules in the file. A client header
(`x-epp-allowed-tiers: a,b`) intersects once more. An empty intersection is a valid answer: the request has no
candidate and is refused with a 503 whose reason names the rules — fail-closed.

A tier is a plain label compared exactly; an endpoint or site whose tier no rule lists (or that has no tier at all)
is not allowed for restricted traffic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.config.federation import FederationConfig
from epp.wire import TIER_HEADER


@dataclass(frozen=True, slots=True)
class Allowance:
    """The tiers one request may reach; `tiers is None` means unrestricted (no rule, no header)."""

    tiers: frozenset[str] | None
    rules: tuple[str, ...] = ()  # names of the rules that matched ("defaultTiers" for the default)
    header: bool = False  # the client's header narrowed it

    def allows(self, tier: str) -> bool:
        return self.tiers is None or (bool(tier) and tier in self.tiers)

    def describe(self) -> str:
        """Names the rule(s) for the 503 reason a client and an operator read."""
        if self.tiers is None:
            return "no residency rule applies"
        parts = []
        if self.rules:
            label = "rule" if len(self.rules) == 1 else "rules"
            parts.append(f"residency {label} {', '.join(repr(r) for r in self.rules)}")
        if self.header:
            parts.append(f"header {TIER_HEADER}")
        shown = ", ".join(sorted(self.tiers)) if self.tiers else "none"
        return f"{' and '.join(parts)} allow tiers [{shown}]"


UNRESTRICTED = Allowance(tiers=None)


def allowance_for(
    config: FederationConfig, models: str | tuple[str, ...], objective: str | None, headers: Mapping[str, str]
) -> Allowance:
    """The allowance of one request, from its model(s), objective and headers (uncached; see `Residency`).

    Several models (the client's and its rewrite target): every rule that names any of them applies."""
    names = (models,) if isinstance(models, str) else models
    return _narrow(_rules_allowance(config, names, objective), headers)


def _rules_allowance(config: FederationConfig, models: tuple[str, ...], objective: str | None) -> Allowance:
    tiers: frozenset[str] | None = None
    names: list[str] = []
    for rule in config.rules:
        if any(rule.matches(model, objective) for model in models):
            tiers = rule.tiers if tiers is None else tiers & rule.tiers
            names.append(rule.name)
    if not names and config.default_tiers is not None:
        tiers = config.default_tiers
        names.append("defaultTiers")
    return UNRESTRICTED if tiers is None else Allowance(tiers=tiers, rules=tuple(names))


def _narrow(allowance: Allowance, headers: Mapping[str, str]) -> Allowance:
    raw = headers.get(TIER_HEADER)
    if raw is None:
        return allowance
    wanted = frozenset(t.strip() for t in raw.split(",") if t.strip())
    tiers = wanted if allowance.tiers is None else allowance.tiers & wanted
    return Allowance(tiers=tiers, rules=allowance.rules, header=True)


class Residency:
    """`allowance_for` with the rules' answer cached per (models, objective): a request then costs one dict lookup
    (plus the header, which is per request). The cache is bounded: a client inventing model names cannot grow it
    without limit; when full it starts over."""

    def __init__(self, config: FederationConfig, max_cached: int = 4096) -> None:
        self._config = config
        self._max = max_cached
        self._cache: dict[tuple[tuple[str, ...], str | None], Allowance] = {}

    def allowance(self, models: tuple[str, ...], objective: str | None, headers: Mapping[str, str]) -> Allowance:
        key = (models, objective)
        base = self._cache.get(key)
        if base is None:
            if len(self._cache) >= self._max:
                self._cache.clear()
            base = self._cache[key] = _rules_allowance(self._config, models, objective)
        return _narrow(base, headers)
