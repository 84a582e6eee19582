"""`--objectives-file`: InferenceObjective and InferenceModelRewrite objects from a YAML file, without a cluster.

The same objects the Kubernetes watches read (either API group: `inference.networking.x-k8s.io` or `llm-d.ai`,
version v1alpha2, as the CRDs), feeding the same ObjectiveStore, so priorities (shedding) and model rewrites work
in a cluster-free picker exactly as in a cluster. Every object in the file counts (a cluster-free picker serves one
pool; `spec.poolRef` is not compared). When two objects of a kind share a name, the llm-d.ai one wins over the
older group's (the group upstream prefers, as the watch does), and within one group the first in the file. A
document of another kind, or a file that cannot be parsed, fails the start with its reason; a malformed rewrite
rule is skipped with a warning, as the watch skips it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from epp.datastore.objectives import ObjectiveStore, RewriteRule
from epp.discovery.kubernetes.objectives import OBJECTIVE_GROUPS, rewrite_rules
from epp.errors import ConfigError

log = logging.getLogger(__name__)

KINDS = ("InferenceObjective", "InferenceModelRewrite")


def _priority(obj: Mapping[str, Any], where: str) -> int:
    priority = (obj.get("spec") or {}).get("priority", 0)
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"{where}: spec.priority must be an integer, got {priority!r}")
    return priority


def load_objectives(path: str, store: ObjectiveStore) -> tuple[int, int]:
    """Read the file into `store`; returns (objectives, rewrite objects). ConfigError names the file and document."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--objectives-file {path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"--objectives-file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    # one dict per group, in OBJECTIVE_GROUPS' precedence order: merged so the preferred group's names win
    priorities_of: dict[str, dict[str, int]] = {g: {} for g in OBJECTIVE_GROUPS}
    rewrites_of: dict[str, dict[str, tuple[RewriteRule, ...]]] = {g: {} for g in OBJECTIVE_GROUPS}
    for i, doc in enumerate(documents):
        where = f"--objectives-file {path}: document {i + 1}"
        if not isinstance(doc, Mapping):
            raise ConfigError(f"{where}: expected an object, got {type(doc).__name__}")
        api_version = str(doc.get("apiVersion") or "")
        group = api_version.split("/", 1)[0]
        kind = doc.get("kind")
        if kind not in KINDS or group not in OBJECTIVE_GROUPS:
            raise ConfigError(
                f"{where}: {api_version or '?'} {kind or '?'} is not an InferenceObjective or InferenceModelRewrite "
                f"of {' or '.join(OBJECTIVE_GROUPS)}"
            )
        meta = doc.get("metadata") or {}
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: metadata.name is required")
        if kind == "InferenceObjective":
            priorities_of[group].setdefault(name, _priority(doc, f"{where} ({name})"))
        else:
            rules = rewrite_rules(doc)
            if rules:
                rewrites_of[group].setdefault(f"{meta.get('namespace') or 'default'}/{name}", rules)
    priorities: dict[str, int] = {}
    rewrites: dict[str, tuple[RewriteRule, ...]] = {}
    for group in OBJECTIVE_GROUPS:
        for key, priority in priorities_of[group].items():
            priorities.setdefault(key, priority)
        for key, rules in rewrites_of[group].items():
            rewrites.setdefault(key, rules)
    store.replace_objectives(priorities)
    store.replace_rewrites(rewrites)
    log.info("--objectives-file %s: %d objectives, %d model rewrites", path, len(priorities), len(rewrites))
    return len(priorities), len(rewrites)
