"""The InferencePool as the picker needs it, parsed from the real v1 object (a dict from YAML or the API)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.datastore.selector import Requirement, selector_matches
from epp.errors import ConfigError

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"


class FailureMode(enum.Enum):
    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"  # the CRD's default


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    namespace: str = "default"
    selector: Mapping[str, str] = field(default_factory=dict)
    target_ports: tuple[int, ...] = ()
    app_protocol: str = "http"
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    epp_service: str = ""
    epp_port: int = 9002
    # Set-based requirements beyond `selector` (matchLabels): standalone mode's `--endpoint-selector` only, since
    # an InferencePool v1 selector has matchLabels alone.
    expressions: tuple[Requirement, ...] = ()

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Every matchLabels pair present in the labels, and every expression holds; an empty selector (no pair,
        no expression) selects nothing."""
        if not self.selector and not self.expressions:
            return False
        return all(labels.get(k) == v for k, v in self.selector.items()) and selector_matches(self.expressions, labels)


def parse_pool(obj: Mapping[str, Any], source: str = "pool") -> PoolSpec:
    """Validate an InferencePool v1 object; ConfigError names the source and the field at fault."""

    def fail(what: str) -> ConfigError:
        return ConfigError(f"{source}: {what}")

    if not isinstance(obj, Mapping):
        raise fail("not a YAML/JSON object")
    api_version = obj.get("apiVersion")
    if api_version != f"{POOL_GROUP}/{POOL_VERSION}":
        raise fail(f"apiVersion must be {POOL_GROUP}/{POOL_VERSION}, got {api_version!r}")
    if obj.get("kind") != "InferencePool":
        raise fail(f"kind must be InferencePool, got {obj.get('kind')!r}")
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise fail("metadata.name is missing")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise fail("spec is missing")
    selector = spec.get("selector") or {}
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        raise fail("spec.selector.matchLabels must be a non-empty map")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise fail("spec.selector.matchLabels must map strings to strings")
    ports_raw = spec.get("targetPorts")
    if not isinstance(ports_raw, list) or not 1 <= len(ports_raw) <= 8:
        raise fail("spec.targetPorts must list 1 to 8 ports")
    ports: list[int] = []
    for i, entry in enumerate(ports_raw):
        number = entry.get("number") if isinstance(entry, Mapping) else None
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            raise fail(f"spec.targetPorts[{i}].number must be a port number 1-65535")
        if number in ports:
            raise fail(f"spec.targetPorts[{i}].number {number} is listed twice")
        ports.append(number)
    ref = spec.get("endpointPickerRef") or {}
    if not isinstance(ref, Mapping):
        raise fail("spec.endpointPickerRef must be an object")
    mode_raw = ref.get("failureMode", FailureMode.FAIL_CLOSE.value)
    try:
        mode = FailureMode(mode_raw)
    except ValueError:
        raise fail(f"spec.endpointPickerRef.failureMode must be FailOpen or FailClose, got {mode_raw!r}") from None
    port_ref = ref.get("port") or {}
    epp_port = port_ref.get("number", 9002) if isinstance(port_ref, Mapping) else 9002
    return PoolSpec(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        selector=dict(labels),
        target_ports=tuple(ports),
        app_protocol=str(spec.get("appProtocol") or "http"),
        failure_mode=mode,
        epp_service=str(ref.get("name") or ""),
        epp_port=int(epp_port),
    )
