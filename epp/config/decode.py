"""Upstream's EndpointPickerConfig, phase one: decode and validate a parsed document into frozen values.

Pure: the document arrives parsed (`epp.config.files` reads the file). Phase two (`epp.scheduling.build`) turns
these values into plugin objects. Splitting them keeps every structural error (a missing field, a dangling
pluginRef, an unknown top-level key) independent of which plugins we implement, and lets `epp check-config` report
both kinds in the same words the server would use at start-up.

Accepted top-level keys are upstream's (apiVersion, kind, plugins, schedulingProfiles, saturationDetector,
featureGates, parser, data / dataLayer, flowControl) plus `federation`, kept as a raw mapping that
`epp.config.federation` parses. Anything else is refused: a misspelt key that is silently ignored is a config that
does not do what its author thinks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from epp.config.durations import parse_duration
from epp.config.model import (
    API_VERSIONS,
    KIND,
    KNOWN_FEATURE_GATES,
    TOP_LEVEL_KEYS,
    EndpointPickerConfig,
    PluginSpec,
    ProfilePlugin,
    ProfileSpec,
    SaturationThresholds,
)
from epp.errors import ConfigError

_SATURATION_FIELDS = {
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


def _decode_refs(raw: object, source: str, key: str, plugin_names: set[str]) -> tuple[str, ...]:
    """`parser` / `data(Layer)`: references to plugins; we check they resolve (their types are checked in build)."""
    refs: list[str] = []
    if key == "parser":
        entry = _mapping(raw, source, key)
        refs.append(_name(entry.get("pluginRef"), source, f"{key}.pluginRef"))
    else:
        entry = _mapping(raw, source, key)
        for i, src in enumerate(_list(entry.get("sources", []), source, f"{key}.sources")):
            src_map = _mapping(src, source, f"{key}.sources[{i}]")
            refs.append(_name(src_map.get("pluginRef"), source, f"{key}.sources[{i}].pluginRef"))
            for j, ext in enumerate(_list(src_map.get("extractors", []), source, f"{key}.sources[{i}].extractors")):
                ext_map = _mapping(ext, source, f"{key}.sources[{i}].extractors[{j}]")
                refs.append(_name(ext_map.get("pluginRef"), source, f"{key}.sources[{i}].extractors[{j}].pluginRef"))
    for ref in refs:
        if ref not in plugin_names:
            raise _fail(source, f"{key}, plugin '{ref}'", "pluginRef names no entry of 'plugins'")
    return tuple(refs)


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
    if "flowControl" in top:
        raise _fail(
            source,
            "flowControl",
            "flow control (priority-band queueing) is not implemented here; "
            "sheddable requests are refused with 429 while the pool is saturated instead",
        )
    if "plugins" not in top:
        raise _fail(source, "plugins", "required")
    plugins = _decode_plugins(top["plugins"], source)
    names = {p.name for p in plugins}
    if "schedulingProfiles" not in top:
        raise _fail(source, "schedulingProfiles", "required")
    profiles = _decode_profiles(top["schedulingProfiles"], source, names)
    notes: list[str] = []
    gates: list[str] = []
    for i, gate in enumerate(_list(top.get("featureGates", []), source, "featureGates")):
        gate = _name(gate, source, f"featureGates[{i}]")
        if gate not in KNOWN_FEATURE_GATES:
            raise _fail(
                source,
                f"featureGates[{i}]",
                f"unknown feature gate {gate!r} (known: {', '.join(sorted(KNOWN_FEATURE_GATES))})",
            )
        gates.append(gate)
        notes.append(f"feature gate {gate!r} has no effect here")
    parser_ref = _decode_refs(top["parser"], source, "parser", names)[0] if top.get("parser") is not None else None
    data_refs: tuple[str, ...] = ()
    for key in ("data", "dataLayer"):
        if top.get(key) is not None:
            data_refs += _decode_refs(top[key], source, key, names)
    federation = top.get("federation")
    if federation is not None:
        federation = dict(_mapping(federation, source, "federation"))
    return EndpointPickerConfig(
        plugins=plugins,
        profiles=profiles,
        api_version=str(api_version),
        saturation=_decode_saturation(top.get("saturationDetector"), source),
        feature_gates=tuple(gates),
        parser_ref=parser_ref,
        data_source_refs=data_refs,
        federation=federation,
        source=source,
        notes=tuple(notes),
    )
