"""InferenceObjectives (name → priority) and InferenceModelRewrite rules, as the watches last saw them.

The Kubernetes watches write here; the director reads. Kept apart from the endpoint table because it changes
rarely and is keyed by object, not by endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    model: str
    weight: int = 1


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """Requests for `source_model` go to one of `targets`, chosen by weight (exact match, as upstream). An empty
    `source_model` is upstream's generic rule (one without `matches`): any model no exact rule names."""

    source_model: str
    targets: tuple[RewriteTarget, ...]

    @property
    def generic(self) -> bool:
        return not self.source_model


class ObjectiveStore:
    """Objects keyed by "namespace/name"; `priority_of` takes the objective's name as the request header gives it.

    Rewrites keep the order they are given in, which is their precedence: the watches give the oldest object first
    (upstream's rule), the objectives file its document order."""

    def __init__(self) -> None:
        self._priorities: dict[str, int] = {}
        self._rewrites: dict[str, tuple[RewriteRule, ...]] = {}
        self._rules_by_model: dict[str, RewriteRule] | None = None
        self.version = 0

    # -- objectives ---------------------------------------------------------------------------------------

    def put_objective(self, name: str, priority: int) -> None:
        self._priorities[name] = priority
        self.version += 1

    def replace_objectives(self, priorities: Mapping[str, int]) -> None:
        self._priorities = dict(priorities)
        self.version += 1

    def priority_of(self, name: str | None) -> int:
        """Unknown or absent objective → 0 (the CRD's default priority)."""
        if not name:
            return 0
        return self._priorities.get(name, 0)

    def objectives(self) -> dict[str, int]:
        return dict(self._priorities)

    # -- model rewrites ------------------------------------------------------------------------------------

    def put_rewrite(self, key: str, rules: tuple[RewriteRule, ...]) -> None:
        self._rewrites[key] = rules
        self._rules_by_model = None
        self.version += 1

    def replace_rewrites(self, rewrites: Mapping[str, tuple[RewriteRule, ...]]) -> None:
        self._rewrites = dict(rewrites)
        self._rules_by_model = None
        self.version += 1

    def rewrites(self) -> dict[str, tuple[RewriteRule, ...]]:
        return dict(self._rewrites)

    def configured_models(self) -> set[str]:
        """Every model name a rewrite rule names (sources and targets): these keep their own metric labels."""
        names: set[str] = set()
        for rules in self._rewrites.values():
            for rule in rules:
                if not rule.generic:
                    names.add(rule.source_model)
                names.update(t.model for t in rule.targets)
        return names

    def rewrite_rule_for(self, model: str) -> RewriteRule | None:
        """The rule whose source is exactly `model`, else the first generic rule (upstream's precedence); when
        several objects name a model, the first in the store's order wins."""
        if self._rules_by_model is None:
            by_model: dict[str, RewriteRule] = {}
            for rules in self._rewrites.values():
                for rule in rules:
                    by_model.setdefault(rule.source_model, rule)  # "" holds the first generic rule
            self._rules_by_model = by_model
        exact = self._rules_by_model.get(model)
        return exact if exact is not None else self._rules_by_model.get("")
