"""Config phase two: instantiate plugins, fill upstream's defaults, assemble the profile; and the default profile.

Defaults as upstream: a plugin's name is its type; a scorer's weight is 1; a profile without a picker gets a
max-score-picker; one profile with no profile handler runs as a single profile. Profile handlers other than the
single one (P/D disaggregation, SLO-aware) are not implemented: such configs are refused, naming the plugin.

The default profile (no config file) adds two things to upstream's (queue 2, kv-cache 2, prefix 3, max-score):
- `inflight-load-scorer` ×2: the queue as it is now (scraped waiting + our picks since the scrape). Without it a
  burst between two scrapes sees identical numbers and lands wherever the first request went;
- `utilization-detector` as a filter: endpoints whose effective queue or KV usage is at the saturation threshold,
  or whose data is not usable (stale or failing: `epp.datastore.usable`), are skipped while others remain. This
  bounds prefix-affinity herding: the prefix scorer (weight 3) would otherwise keep a hot prompt on one endpoint
  however deep its queue grows.
`upstream_default_config()` keeps upstream's exact profile for side-by-side benchmarks. Measured with
benchmarks/quality.py (benchmarks/RESULTS.md, "Scheduling"): p90 TTFT equal or lower on every workload at 80% and
110% load (azure-conv 157 vs 589 ms, azure-code 2.5 vs 4.2 s at 80%); the one loss is mooncake at 110%, where
spreading costs prefix hits (hit rate 0.09 vs 0.16) and e2e p50 (10.5 vs 7.6 s). Weight 1 for the in-flight
scorer recovers that case but loses azure-code p99 (5.4 vs 3.2 s) and lets half of a 100-request burst land on
one endpoint, so 2 it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import numpy as np

from epp.config.model import EndpointPickerConfig, PluginSpec, ProfilePlugin, ProfileSpec
from epp.datastore import Freshness
from epp.errors import ConfigError
from epp.scheduling.framework import Filter, Picker, PickObserver
from epp.scheduling.params import Params
from epp.scheduling.pickers import MaxScorePicker
from epp.scheduling.profile import ProfileScheduler, SchedulingProfile, WeightedScorer
from epp.scheduling.registry import BuildContext, Kind, Registry, builtin_registry
from epp.scheduling.saturation import SaturationDetector

DEFAULT_SCORER_WEIGHT = 1.0


def _config(source: str, profile: tuple[tuple[str, float | None], ...]) -> EndpointPickerConfig:
    plugins = tuple(PluginSpec(name=t, type=t) for t, _ in profile)
    refs = tuple(ProfilePlugin(t, w) for t, w in profile)
    return EndpointPickerConfig(plugins=plugins, profiles=(ProfileSpec("default", refs),), source=source)


def upstream_default_config() -> EndpointPickerConfig:
    """Upstream's built-in profile, unchanged."""
    return _config(
        "<upstream default>",
        (
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0),
            ("max-score-picker", None),
        ),
    )


def default_config() -> EndpointPickerConfig:
    """Our built-in profile (see the module docstring for why it differs from upstream's)."""
    return _config(
        "<built-in default>",
        (
            ("utilization-detector", None),
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0),
            ("inflight-load-scorer", 2.0),
            ("max-score-picker", None),
        ),
    )


def _instantiate(
    config: EndpointPickerConfig, registry: Registry, ctx: BuildContext
) -> dict[str, tuple[Kind, object, PluginSpec]]:
    unknown = [spec for spec in config.plugins if registry.get(spec.type) is None]
    if unknown:
        listed = "; ".join(f"plugin '{s.name}': type '{s.type}'" for s in unknown)
        raise ConfigError(
            f"{config.source}: {listed}: not implemented here (known types: {', '.join(registry.names())})"
        )
    built: dict[str, tuple[Kind, object, PluginSpec]] = {}
    for spec in config.plugins:
        plugin_type = registry.get(spec.type)
        assert plugin_type is not None
        params = Params(spec.parameters, f"{config.source}: plugin '{spec.name}' ({spec.type})")
        built[spec.name] = (plugin_type.kind, plugin_type.factory(spec.name, params, ctx), spec)
    return built


def _profile(
    config: EndpointPickerConfig, spec: ProfileSpec, built: dict[str, tuple[Kind, object, PluginSpec]], seed: int
) -> SchedulingProfile:
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    pickers: list[Picker] = []
    for ref in spec.plugins:
        kind, plugin, plugin_spec = built[ref.plugin_ref]
        where = f"{config.source}: profile '{spec.name}', plugin '{ref.plugin_ref}' ({plugin_spec.type})"
        if ref.weight is not None and kind is not Kind.SCORER:
            raise ConfigError(f"{where}: a weight applies to scorers only; this plugin is a {kind.value}")
        if kind is Kind.FILTER:
            filters.append(plugin)  # type: ignore[arg-type]
        elif kind is Kind.SCORER:
            weight = DEFAULT_SCORER_WEIGHT if ref.weight is None else ref.weight
            scorers.append(WeightedScorer(plugin, weight))  # type: ignore[arg-type]
        elif kind is Kind.PICKER:
            pickers.append(plugin)  # type: ignore[arg-type]
        else:
            raise ConfigError(f"{where}: a {kind.value} cannot be part of a profile")
    if len(pickers) > 1:
        names = ", ".join(p.name for p in pickers)
        raise ConfigError(f"{config.source}: profile '{spec.name}': more than one picker ({names})")
    picker = pickers[0] if pickers else MaxScorePicker(seed=seed)
    observers = tuple(cast(PickObserver, s.scorer) for s in scorers if hasattr(s.scorer, "picked"))
    return SchedulingProfile(spec.name, tuple(filters), tuple(scorers), picker, observers)


def build_scheduler(
    config: EndpointPickerConfig | None = None,
    seed: int | None = 0,
    registry: Registry | None = None,
    freshness: Freshness | None = None,
) -> ProfileScheduler:
    """Phase two: plugin objects from a decoded config (None → `default_config()`); raises ConfigError.

    The result satisfies the director's `Scheduler` protocol; `.saturation` is the pool's saturation detector
    built from the config's `saturationDetector` block, for the director's shedding step. `freshness` is the pool's
    rule for usable data (`epp serve`: from --metrics-staleness-threshold and --metrics-max-failures);
    `pool_freshness` says how the config can change it.
    """
    config = config or default_config()
    registry = registry or builtin_registry()
    seeds = np.random.SeedSequence(seed)
    freshness = pool_freshness(config, freshness or Freshness())
    ctx = BuildContext(seed_sequence=seeds, saturation=config.saturation, freshness=freshness)
    built = _instantiate(config, registry, ctx)
    handlers = [(name, spec) for name, (kind, _, spec) in built.items() if kind is Kind.PROFILE_HANDLER]
    if len(handlers) > 1:
        raise ConfigError(f"{config.source}: more than one profile handler ({', '.join(n for n, _ in handlers)})")
    if len(config.profiles) > 1:
        names = ", ".join(p.name for p in config.profiles)
        raise ConfigError(
            f"{config.source}: {len(config.profiles)} scheduling profiles ({names}): only a single profile is "
            "implemented here (single-profile-handler); multi-profile handlers such as P/D disaggregation are not"
        )
    if config.parser_ref is not None and built[config.parser_ref][0] is not Kind.PARSER:
        raise ConfigError(f"{config.source}: parser, plugin '{config.parser_ref}': is not a parser plugin")
    for ref in config.data_source_refs:
        kind, _, spec = built[ref]
        if kind is not Kind.DATA_LAYER:
            raise ConfigError(f"{config.source}: data layer, plugin '{ref}' ({spec.type}): is not a data source here")
    profile = _profile(config, config.profiles[0], built, ctx.next_seed())
    return ProfileScheduler(profile, SaturationDetector(config.saturation, freshness))


def pool_freshness(config: EndpointPickerConfig, flags: Freshness) -> Freshness:
    """The pool's one staleness threshold: upstream's saturation-only `saturationDetector.metricsStalenessThreshold`
    where the config file gives one (an upstream config then behaves as it did there), else the flag's. A
    utilization-detector plugin may repeat it, not differ from it (one threshold: see the registry)."""
    staleness = config.saturation.staleness_s
    return flags if staleness is None else replace(flags, staleness_s=staleness)
