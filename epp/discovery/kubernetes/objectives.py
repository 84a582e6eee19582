"""InferenceObjective (priority) and InferenceModelRewrite (rules) objects → what the ObjectiveStore holds.

Both kinds exist in two API groups with the same schema: llm-d.ai, where the llm-d router moved them, and the
older inference.networking.x-k8s.io. We watch both, and per kind the group in force is upstream's: llm-d.ai
whenever the API server serves that kind there (its CRD installed), the older group only when it does not; with
both CRDs installed the older group's objects are ignored, as upstream ignores them (`group_in_force`). Only
objects whose `spec.poolRef` names our pool count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from epp.datastore.objectives import RewriteRule, RewriteTarget
from epp.datastore.pool import POOL_GROUP

log = logging.getLogger(__name__)

PREFERRED_GROUP = "llm-d.ai"
LEGACY_GROUP = "inference.networking.x-k8s.io"
OBJECTIVE_GROUPS = (PREFERRED_GROUP, LEGACY_GROUP)  # in precedence order
OBJECTIVE_VERSION = "v1alpha2"
OBJECTIVES_PLURAL = "inferenceobjectives"
REWRITES_PLURAL = "inferencemodelrewrites"


def group_in_force(served: Mapping[str, bool | None]) -> str | None:
    """The group whose objects of one kind count: the first of `OBJECTIVE_GROUPS` the server serves; None while
    that is not known yet.

    `served` maps a group to whether its list found the kind: True, False (404: its CRD is not installed), or
    None / absent while the list has not answered. Undecided until every group ahead of the answer has answered:
    otherwise, when the older group's list lands first, its objects would count until llm-d.ai's list lands and
    the picker would route by rules that upstream never applies (upstream picks the group from API discovery
    before it watches). A served group wins even while it holds no object, so deleting the last llm-d.ai object
    does not bring the older group's objects back: upstream's answer too.
    """
    for group in OBJECTIVE_GROUPS:
        answer = served.get(group)
        if answer is None:
            return None
        if answer:
            return group
    return None


def _age_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    created = meta.get("creationTimestamp")
    # an object without a timestamp (never from an API server) sorts after the dated ones
    return (
        created if isinstance(created, str) and created else "~",
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
    )


def refers_to_pool(obj: Mapping[str, Any], pool_name: str, pool_group: str = POOL_GROUP) -> bool:
    """`spec.poolRef` names our pool (group and kind default as the CRD defaults them)."""
    ref = (obj.get("spec") or {}).get("poolRef")
    if not isinstance(ref, Mapping):
        return False
    return (
        ref.get("name") == pool_name
        and (ref.get("group") or POOL_GROUP) == pool_group
        and (ref.get("kind") or "InferencePool") == "InferencePool"
    )


def objective_priorities(objects: Iterable[Mapping[str, Any]], pool_name: str, pool_group: str) -> dict[str, int]:
    """name → priority of the objectives for our pool; an unset priority is 0, as the CRD says."""
    out: dict[str, int] = {}
    for obj in objects:
        if not refers_to_pool(obj, pool_name, pool_group):
            continue
        name = str((obj.get("metadata") or {}).get("name") or "")
        priority = (obj.get("spec") or {}).get("priority")
        if not isinstance(priority, int) or isinstance(priority, bool):
            if priority is not None:
                log.warning("InferenceObjective %s: priority %r is not an integer; using 0", name, priority)
            priority = 0
        if name:
            out.setdefault(name, priority)
    return out


def rewrite_rules(obj: Mapping[str, Any]) -> tuple[RewriteRule, ...]:
    """One RewriteRule per matched model of each rule, or one generic rule (source "") for a rule without
    `matches` (upstream applies it to any model no exact rule names); malformed rules are skipped with a warning."""
    name = (obj.get("metadata") or {}).get("name")
    rules: list[RewriteRule] = []
    for i, rule in enumerate((obj.get("spec") or {}).get("rules") or []):
        if not isinstance(rule, Mapping):
            continue
        targets: list[RewriteTarget] = []
        for target in rule.get("targets") or []:
            if not isinstance(target, Mapping) or not isinstance(target.get("modelRewrite"), str):
                continue
            weight = target.get("weight", 1)
            if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
                weight = 1
            targets.append(RewriteTarget(model=target["modelRewrite"], weight=weight))
        matches = rule.get("matches") or []
        sources = [
            m["model"]["value"]
            for m in matches
            if isinstance(m, Mapping)
            and isinstance(m.get("model"), Mapping)
            and isinstance(m["model"].get("value"), str)
            and m["model"]["value"]
            and (m["model"].get("type") or "Exact") == "Exact"
        ]
        if not matches:
            sources = [""]  # generic: every model without an exact rule
        if not targets or not sources:
            log.warning("InferenceModelRewrite %s: rules[%d] has no exact model match or no target; skipped", name, i)
            continue
        rules.extend(RewriteRule(source_model=s, targets=tuple(targets)) for s in sources)
    return tuple(rules)


def pool_rewrites(
    objects: Iterable[Mapping[str, Any]], pool_name: str, pool_group: str
) -> dict[str, tuple[RewriteRule, ...]]:
    """ "namespace/name" → rules of the rewrites for our pool, oldest object first (upstream's precedence when
    several rules name one model: the oldest `creationTimestamp`; RFC 3339 UTC strings sort as times; ties by key)."""
    out: dict[str, tuple[RewriteRule, ...]] = {}
    for obj in sorted(objects, key=_age_key):
        if not refers_to_pool(obj, pool_name, pool_group):
            continue
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        rules = rewrite_rules(obj)
        if rules:
            out.setdefault(key, rules)
    return out
