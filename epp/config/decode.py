"""Upstream's EndpointPickerConfig, phase one: decode and validate a parsed document into frozen values.

Pure: the document arrives parsed (`epp.config.files` reads the file). Phase two (`epp.scheduling.build`) turns
these values into plugin objects. Splitting them keeps every structural error (a missing field, a dangling
pluginRef, an unknown top-level key) independent of which plugins we implement, and lets `epp check-config` report
both kinds in the same words the server would use at start-up.

Accepted top-level keys are upstream's (apiVersion, kind, plugins, schedulingProfiles, featureGates,
requestHandler, dataLayer / data, flowControl, and the deprecated saturationDetector and parser) plus `federation`,
kept as a raw mapping that `epp.config.federation` parses. Anything else is refused: a misspelt key that is silently
ignored is a config that does not do what its author thinks. Where upstream logs a deprecation (the older apiVersion,
top-level parser and saturationDetector, a flowControl section with its gate off) the decoded config carries the
same sentence in `warnings`, which the loader logs and check-config prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from epp.config.durations import parse_duration
from epp.config.flowcontrol import parse_flow_control
from epp.config.model import (
    API_VERSIONS,
    CURRENT_API_VERSION,
    FEATURE_GATES,
    FLOW_CONTROL_GATE,
    HA_POPULATE_GATE,
    KIND,
    RETIRED_FEATURE_GATES,
    TOP_LEVEL_KEYS,
    DataSourceSpec,
    EndpointPickerConfig,
    PluginSpec,
    ProfilePlugin,
    ProfileSpec,
    SaturationThresholds,
)
from epp.errors import ConfigError

_SATURATION_FIELDS = {
    "pluginRef",
    "queueDepthThreshold",
    "kvCacheUtilThreshold",
    "metricsStalenessThreshold",
    "headroom",
}


def _fail(source: str, where: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: {where}: {why}" if where else f"{source}: {why}")


def _mapping(value: object, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(source, where, f"expected a mapping, got {type(value).__name__}")
    return value


def _list(value: object, source: str, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(source, where, f"expected a list, got {type(value).__name__}")
    return value


def _name(value: object, source: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(source, where, f"expected a non-empty string, got {value!r}")
    return value


def _decode_plugins(raw: object, source: str) -> tuple[PluginSpec, ...]:
    specs: list[PluginSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(_list(raw, source, "plugins")):
        where = f"plugins[{i}]"
        entry = _mapping(item, source, where)
        unknown = set(entry) - {"name", "type", "parameters"}
        if unknown:
            raise _fail(source, where, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        type_name = _name(entry.get("type"), source, f"{where}.type")
        name = _name(entry.get("name", type_name), source, f"{where}.name")  # upstream: name defaults to type
        if name in seen:
            raise _fail(source, f"plugin '{name}'", "defined twice (plugin names must be unique)")
        seen.add(name)
        params = entry.get("parameters")
        if params is not None:
            params = dict(_mapping(params, source, f"plugin '{name}' ({type_name}).parameters"))
        specs.append(PluginSpec(name=name, type=type_name, parameters=params or {}))
    return tuple(specs)


def _decode_profiles(raw: object, source: str, plugin_names: set[str]) -> tuple[ProfileSpec, ...]:
    profiles: list[ProfileSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(_list(raw, source, "schedulingProfiles")):
        entry = _mapping(item, source, f"schedulingProfiles[{i}]")
        name = _name(entry.get("name"), source, f"schedulingProfiles[{i}].name")
        where = f"profile '{name}'"
        unknown = set(entry) - {"name", "plugins"}
        if unknown:
            raise _fail(source, where, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        if name in seen:
            raise _fail(source, where, "defined twice (profile names must be unique)")
        seen.add(name)
        refs: list[ProfilePlugin] = []
        used: set[str] = set()
        for j, ref_item in enumerate(_list(entry.get("plugins"), source, f"{where}.plugins")):
            ref = _mapping(ref_item, source, f"{where}.plugins[{j}]")
            unknown = set(ref) - {"pluginRef", "weight"}
            if unknown:
                raise _fail(source, f"{where}.plugins[{j}]", f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
            plugin_ref = _name(ref.get("pluginRef"), source, f"{where}.plugins[{j}].pluginRef")
            if plugin_ref not in plugin_names:
                raise _fail(source, f"{where}, plugin '{plugin_ref}'", "pluginRef names no entry of 'plugins'")
            if plugin_ref in used:
                raise _fail(source, f"{where}, plugin '{plugin_ref}'", "referenced twice in the same profile")
            used.add(plugin_ref)
            weight = ref.get("weight")
            if weight is not None and (
                isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight)
            ):
                raise _fail(source, f"{where}, plugin '{plugin_ref}'", f"weight must be a number, got {weight!r}")
            if weight is not None and weight < 0:
                raise _fail(source, f"{where}, plugin '{plugin_ref}'", f"weight must be >= 0, got {weight}")
            refs.append(ProfilePlugin(plugin_ref, None if weight is None else float(weight)))
        profiles.append(ProfileSpec(name=name, plugins=tuple(refs)))
    if not profiles:
        raise _fail(source, "schedulingProfiles", "at least one profile is required")
    return tuple(profiles)


def _decode_saturation(raw: object, source: str) -> SaturationThresholds:
    if raw is None:
        return SaturationThresholds()
    entry = _mapping(raw, source, "saturationDetector")
    unknown = set(entry) - _SATURATION_FIELDS
    if unknown:
        raise _fail(source, "saturationDetector", f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    defaults = SaturationThresholds()

    def number(key: str, default: float, upper: float | None = None) -> float:
        value = entry.get(key)
        if value is None or value == 0:  # upstream: omitted or zero means the default
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise _fail(source, f"saturationDetector.{key}", f"expected a positive number, got {value!r}")
        if upper is not None and value > upper:
            raise _fail(source, f"saturationDetector.{key}", f"must be <= {upper}, got {value}")
        return float(value)

    staleness: float | None = None  # not given: the pool's threshold (--metrics-staleness-threshold)
    if entry.get("metricsStalenessThreshold") not in (None, 0, ""):
        try:
            staleness = parse_duration(entry["metricsStalenessThreshold"])
        except ValueError as exc:
            raise _fail(source, "saturationDetector.metricsStalenessThreshold", str(exc)) from None
    return SaturationThresholds(
        queue_depth=number("queueDepthThreshold", defaults.queue_depth),
        kv_util=number("kvCacheUtilThreshold", defaults.kv_util, upper=1.0),
        staleness_s=staleness,
        headroom=number("headroom", defaults.headroom, upper=1.0),
    )


def _ref_to(value: object, source: str, where: str, plugin_names: set[str]) -> str:
    ref = _name(value, source, f"{where}.pluginRef")
    if ref not in plugin_names:
        raise _fail(source, f"{where}, plugin '{ref}'", "pluginRef names no entry of 'plugins'")
    return ref


def _decode_parsers(top: Mapping[str, Any], source: str, names: set[str], warnings: list[str]) -> tuple[str, ...]:
    """`requestHandler.parsers`, else the deprecated top-level `parser` (upstream: the new field wins)."""
    refs: list[str] = []
    handler = top.get("requestHandler")
    if handler is not None:
        entry = _mapping(handler, source, "requestHandler")
        unknown = set(entry) - {"parsers"}
        if unknown:
            raise _fail(source, "requestHandler", f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        for i, item in enumerate(_list(entry.get("parsers") or [], source, "requestHandler.parsers")):
            where = f"requestHandler.parsers[{i}]"
            ref_map = _mapping(item, source, where)
            if set(ref_map) - {"pluginRef"}:
                raise _fail(source, where, "expected only 'pluginRef'")
            refs.append(_ref_to(ref_map.get("pluginRef"), source, where, names))
    if top.get("parser") is not None:
        warnings.append(
            "top-level 'parser' is deprecated, use requestHandler.parsers (if both are set, the new one is used)"
        )
        entry = _mapping(top["parser"], source, "parser")
        if set(entry) - {"pluginRef"}:
            raise _fail(source, "parser", "expected only 'pluginRef'")
        old = _ref_to(entry.get("pluginRef"), source, "parser", names)
        if not refs:
            refs.append(old)
    return tuple(refs)


_DATA_LAYER_FIELDS = {"sources", "discovery", "injectDefaults"}


def _decode_data_layer(
    raw: object, source: str, key: str, names: set[str]
) -> tuple[tuple[DataSourceSpec, ...], str | None, bool]:
    """`dataLayer` (or the older `data`): sources with their extractors, the discovery plugin, injectDefaults."""
    entry = _mapping(raw, source, key)
    unknown = set(entry) - _DATA_LAYER_FIELDS
    if unknown:
        raise _fail(
            source,
            key,
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))} "
            f"(accepted: {', '.join(sorted(_DATA_LAYER_FIELDS))}; "
            "peer discovery and cross-replica state sharing are not implemented here)",
        )
    sources: list[DataSourceSpec] = []
    for i, src in enumerate(_list(entry.get("sources") or [], source, f"{key}.sources")):
        where = f"{key}.sources[{i}]"
        src_map = _mapping(src, source, where)
        if set(src_map) - {"pluginRef", "extractors"}:
            raise _fail(source, where, "expected only 'pluginRef' and 'extractors'")
        ref = _ref_to(src_map.get("pluginRef"), source, where, names)
        extractors = tuple(
            _ref_to(
                _mapping(ext, source, f"{where}.extractors[{j}]").get("pluginRef"),
                source,
                f"{where}.extractors[{j}]",
                names,
            )
            for j, ext in enumerate(_list(src_map.get("extractors") or [], source, f"{where}.extractors"))
        )
        sources.append(DataSourceSpec(ref, extractors))
    discovery = None
    if entry.get("discovery") is not None:
        disc = _mapping(entry["discovery"], source, f"{key}.discovery")
        if set(disc) - {"pluginRef"}:
            raise _fail(source, f"{key}.discovery", "expected only 'pluginRef'")
        discovery = _ref_to(disc.get("pluginRef"), source, f"{key}.discovery", names)
    inject = entry.get("injectDefaults", True)
    if not isinstance(inject, bool):
        raise _fail(source, f"{key}.injectDefaults", f"expected true or false, got {inject!r}")
    return tuple(sources), discovery, inject


def _decode_gates(raw: object, source: str, notes: list[str], warnings: list[str]) -> dict[str, bool]:
    """`name`, `name=true`, `name=false` (upstream's forms; the value as Go's strconv.ParseBool reads it)."""
    gates = dict(FEATURE_GATES)
    for i, item in enumerate(_list(raw or [], source, "featureGates")):
        text = _name(item, source, f"featureGates[{i}]")
        name, sep, value_text = text.partition("=")
        name = name.strip()
        if name in RETIRED_FEATURE_GATES:
            warnings.append(f"feature gate '{name}' belongs to an older release of the API and has no effect")
            continue
        if name not in FEATURE_GATES:
            raise _fail(
                source,
                f"featureGates[{i}]",
                f"unknown feature gate '{name}' (known: {', '.join(sorted(FEATURE_GATES))})",
            )
        value = True
        if sep:
            word = value_text.strip().lower()
            if word in _TRUE:
                value = True
            elif word in _FALSE:
                value = False
            else:
                raise _fail(
                    source, f"featureGates[{i}]", f"{value_text!r} is not a valid value for the feature gate {name}"
                )
        gates[name] = value
    if gates[HA_POPULATE_GATE] is False:
        notes.append(f"feature gate '{HA_POPULATE_GATE}' off: standbys do not watch the pool (they always do here)")
    return gates


_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def _saturation_ref(raw: object, source: str, names: set[str]) -> str | None:
    """The deprecated top-level `saturationDetector`: upstream's `{pluginRef}`, or the older threshold fields."""
    if isinstance(raw, Mapping) and raw.get("pluginRef") is not None:
        return _ref_to(raw["pluginRef"], source, "saturationDetector", names)
    return None


def parse_config(doc: object, source: str = "<config>") -> EndpointPickerConfig:
    """Decode + validate one EndpointPickerConfig document (already parsed from YAML)."""
    if doc is None:
        raise _fail(source, "", "the file is empty")
    top = _mapping(doc, source, "top level")
    unknown = sorted(str(k) for k in top if k not in TOP_LEVEL_KEYS)
    if unknown:
        raise _fail(
            source,
            "top level",
            f"unknown key(s) {', '.join(unknown)} (accepted: {', '.join(sorted(TOP_LEVEL_KEYS))})",
        )
    api_version = top.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise _fail(source, "apiVersion", f"expected one of {', '.join(API_VERSIONS)}, got {api_version!r}")
    if top.get("kind") != KIND:
        raise _fail(source, "kind", f"expected {KIND}, got {top.get('kind')!r}")
    notes: list[str] = []
    warnings: list[str] = []
    if api_version != CURRENT_API_VERSION:
        warnings.append(f"apiVersion {api_version} is deprecated, use {CURRENT_API_VERSION}")
    if "plugins" not in top:
        raise _fail(source, "plugins", "required")
    plugins = _decode_plugins(top["plugins"], source)
    names = {p.name for p in plugins}
    if "schedulingProfiles" not in top:
        raise _fail(source, "schedulingProfiles", "required")
    profiles = _decode_profiles(top["schedulingProfiles"], source, names)
    gates = _decode_gates(top.get("featureGates"), source, notes, warnings)
    parser_refs = _decode_parsers(top, source, names, warnings)
    sources: tuple[DataSourceSpec, ...] = ()
    discovery: str | None = None
    inject = True
    for key in ("data", "dataLayer"):
        if top.get(key) is not None:
            more, disc, inj = _decode_data_layer(top[key], source, key, names)
            sources += more
            discovery = disc or discovery
            inject = inject and inj
    flow_control = None
    if top.get("flowControl") is not None:
        flow_control = parse_flow_control(top["flowControl"], source, names)
        if not gates[FLOW_CONTROL_GATE] and flow_control.ignored_without_gate:
            warnings.append(
                "the flowControl section is set but the flowControl feature gate is off; its settings other than "
                f"saturationDetector are ignored ({', '.join(flow_control.ignored_without_gate)})"
            )
    detector_ref = flow_control.saturation_detector_ref if flow_control is not None else None
    if top.get("saturationDetector") is not None:
        warnings.append(
            "top-level saturationDetector is deprecated, use flowControl.saturationDetector "
            "(if both are set, the new one is used)"
        )
        detector_ref = detector_ref or _saturation_ref(top["saturationDetector"], source, names)
    federation = top.get("federation")
    if federation is not None:
        federation = dict(_mapping(federation, source, "federation"))
    return EndpointPickerConfig(
        plugins=plugins,
        profiles=profiles,
        api_version=str(api_version),
        saturation=_decode_saturation(top.get("saturationDetector"), source),
        feature_gates=gates,
        parser_refs=parser_refs,
        data_sources=sources,
        discovery_ref=discovery,
        inject_data_defaults=inject,
        saturation_detector_ref=detector_ref,
        flow_control=flow_control,
        federation=federation,
        source=source,
        notes=tuple(notes),
        warnings=tuple(warnings),
    )
