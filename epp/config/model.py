"""The EndpointPickerConfig file as frozen values: one typed section per top-level key that is interpreted.

Upstream's keys (apiVersion, kind, plugins, schedulingProfiles, saturationDetector, featureGates, parser,
data / dataLayer, flowControl) plus `federation`. A section that another package owns the schema of stays a raw
mapping here (`federation`, read by `epp.config.federation`; a plugin's `parameters`, read by the plugin's factory
in `epp.scheduling.registry`), so adding a key means one dataclass here and one decoder in `epp.config.decode`.
Instantiation of plugins is not config: it lives in `epp.scheduling.build`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
KIND = "EndpointPickerConfig"
TOP_LEVEL_KEYS = frozenset(
    {
        "apiVersion",
        "kind",
        "plugins",
        "schedulingProfiles",
        "saturationDetector",
        "featureGates",
        "parser",
        "data",
        "dataLayer",
        "flowControl",
        "federation",
    }
)
# Upstream's feature gates. None changes our behaviour: the data layer is how we always scrape, and flow control
# (queueing by priority band) is not implemented; `notes` on the loaded config says so, check-config prints it.
KNOWN_FEATURE_GATES = frozenset({"dataLayer", "flowControl", "prepareDataPlugins", "enableLegacyMetrics"})

DEFAULT_QUEUE_DEPTH = 5
DEFAULT_KV_UTIL = 0.8
DEFAULT_HEADROOM = 0.0


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    """The `saturationDetector` section (upstream's utilization detector), read by the detector and its filter."""

    queue_depth: float = DEFAULT_QUEUE_DEPTH
    kv_util: float = DEFAULT_KV_UTIL
    # Upstream's saturation-only staleness threshold, where the file gives one: it becomes the pool's one threshold
    # for usable data (`epp.scheduling.build.pool_freshness`). None: --metrics-staleness-threshold applies.
    staleness_s: float | None = None
    headroom: float = DEFAULT_HEADROOM  # the filter's burst allowance above the thresholds, a fraction


@dataclass(frozen=True, slots=True)
class PluginSpec:
    name: str
    type: str
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProfilePlugin:
    plugin_ref: str
    weight: float | None = None  # only meaningful for scorers; upstream's default is 1


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    name: str
    plugins: tuple[ProfilePlugin, ...]


@dataclass(frozen=True, slots=True)
class EndpointPickerConfig:
    """A decoded, structurally valid config. `source` names the file in every later error."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    api_version: str = API_VERSIONS[0]
    saturation: SaturationThresholds = field(default_factory=SaturationThresholds)
    feature_gates: tuple[str, ...] = ()
    parser_ref: str | None = None
    data_source_refs: tuple[str, ...] = ()
    federation: Mapping[str, Any] | None = None  # raw: epp.config.federation.parse_federation owns its schema
    source: str = "<built-in>"
    notes: tuple[str, ...] = ()

    def plugin(self, name: str) -> PluginSpec:
        for spec in self.plugins:
            if spec.name == name:
                return spec
        raise KeyError(name)
