"""The EndpointPickerConfig file as frozen values: one typed section per top-level key that is interpreted.

Upstream's keys (apiVersion, kind, plugins, schedulingProfiles, featureGates, requestHandler, dataLayer (and the
older `data`), flowControl, and the deprecated top-level saturationDetector and parser) plus `federation`. A
section that another package owns the schema of stays a raw
mapping here (`federation`, read by `epp.config.federation`; a plugin's `parameters`, read by the plugin's factory
in `epp.scheduling.registry`), so adding a key means one dataclass here and one decoder in `epp.config.decode`.
Instantiation of plugins is not config: it lives in `epp.scheduling.build`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.config.flowcontrol import FlowControlSpec

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
        "requestHandler",
        "parser",
        "data",
        "dataLayer",
        "flowControl",
        "federation",
    }
)
# The current upstream API group, and the older one it still reads with a deprecation warning.
CURRENT_API_VERSION = "llm-d.ai/v1alpha1"

# Upstream's feature gates and their defaults (llm-d-router cmd/epp/runner/runner.go): a gate is written `name`,
# `name=true` or `name=false`; any other name is an error naming it.
FLOW_CONTROL_GATE = "flowControl"
HA_POPULATE_GATE = "haPopulateNonLeaderDatastore"
FEATURE_GATES: Mapping[str, bool] = {FLOW_CONTROL_GATE: False, HA_POPULATE_GATE: True}
# Gates of the older API (gateway-api-inference-extension before the move): the behaviour they switched on is
# always on here, so they are accepted with a deprecation warning instead of failing files written for it.
RETIRED_FEATURE_GATES = frozenset({"dataLayer", "prepareDataPlugins", "enableLegacyMetrics"})

# Upstream's default parser list, in its order: the first three claim paths, the passthrough parser takes the rest.
DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")

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
class DataSourceSpec:
    """One `dataLayer.sources[]` entry: a source plugin and the extractors that read what it collects."""

    plugin_ref: str
    extractor_refs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EndpointPickerConfig:
    """A decoded, structurally valid config. `source` names the file in every later error."""

    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    api_version: str = API_VERSIONS[0]
    saturation: SaturationThresholds = field(default_factory=SaturationThresholds)
    # every known gate with its value: the file's setting, else upstream's default
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    parser_refs: tuple[str, ...] = ()  # requestHandler.parsers (or the deprecated top-level parser); () = defaults
    data_sources: tuple[DataSourceSpec, ...] = ()
    discovery_ref: str | None = None  # dataLayer.discovery.pluginRef: an endpoint-discovery plugin replaces the cluster
    inject_data_defaults: bool = True  # dataLayer.injectDefaults
    saturation_detector_ref: str | None = None  # flowControl.saturationDetector (or top-level) pluginRef
    flow_control: FlowControlSpec | None = None
    federation: Mapping[str, Any] | None = None  # raw: epp.config.federation.parse_federation owns its schema
    source: str = "<built-in>"
    notes: tuple[str, ...] = ()  # facts check-config prints (a gate with no effect here)
    warnings: tuple[str, ...] = ()  # deprecations and ignored settings, logged at WARNING where the file is loaded

    def gate(self, name: str) -> bool:
        return self.feature_gates.get(name, False)

    @property
    def data_source_refs(self) -> tuple[str, ...]:
        """Every plugin the data layer names (sources and their extractors), in file order."""
        return tuple(ref for s in self.data_sources for ref in (s.plugin_ref, *s.extractor_refs))

    def plugin(self, name: str) -> PluginSpec:
        for spec in self.plugins:
            if spec.name == name:
                return spec
        raise KeyError(name)
