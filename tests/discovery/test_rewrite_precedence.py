"""Which InferenceModelRewrite rule a model gets, as upstream's rewrite store decides it.

Upstream's facts (llm-d-router `pkg/epp/datastore/modelrewritestore.go`): a rule without `matches` is generic and
applies to any model that no exact rule names; among several rules for one model (or several generic ones) the
oldest object by `creationTimestamp` wins.
"""

from __future__ import annotations

from typing import Any

from epp.datastore.objectives import ObjectiveStore, RewriteTarget
from epp.discovery.kubernetes.objectives import pool_rewrites
from tests.discovery.k8s_objects import rewrite


def _dated(obj: dict[str, Any], created: str) -> dict[str, Any]:
    obj["metadata"]["creationTimestamp"] = created
    return obj


def _generic(name: str, target: str, created: str) -> dict[str, Any]:
    obj = _dated(rewrite(name, "unused", {target: 1}), created)
    del obj["spec"]["rules"][0]["matches"]
    return obj


def _store(*objects: dict[str, Any]) -> ObjectiveStore:
    store = ObjectiveStore()
    store.replace_rewrites(pool_rewrites(objects, "pool", "inference.networking.k8s.io"))
    return store


def test_the_oldest_rule_for_a_model_wins_whatever_its_name() -> None:
    store = _store(
        _dated(rewrite("a-newer", "llama", {"llama-new": 1}), "2026-05-02T00:00:00Z"),
        _dated(rewrite("z-older", "llama", {"llama-old": 1}), "2026-05-01T00:00:00Z"),
    )
    rule = store.rewrite_rule_for("llama")
    assert rule is not None and rule.targets == (RewriteTarget("llama-old", 1),)


def test_a_rule_without_matches_applies_to_every_model_without_an_exact_rule() -> None:
    store = _store(
        _generic("catch-all-new", "fallback-new", "2026-05-03T00:00:00Z"),
        _generic("catch-all-old", "fallback-old", "2026-05-02T00:00:00Z"),
        _dated(rewrite("exact", "llama", {"llama-v2": 1}), "2026-05-09T00:00:00Z"),
    )
    assert store.rewrite_rule_for("llama").targets == (RewriteTarget("llama-v2", 1),)  # exact beats generic
    assert store.rewrite_rule_for("mistral").targets == (RewriteTarget("fallback-old", 1),)  # the oldest generic
    assert "" not in store.configured_models() and "fallback-old" in store.configured_models()


def test_without_a_generic_rule_an_unnamed_model_is_not_rewritten() -> None:
    store = _store(_dated(rewrite("exact", "llama", {"llama-v2": 1}), "2026-05-09T00:00:00Z"))
    assert store.rewrite_rule_for("mistral") is None
