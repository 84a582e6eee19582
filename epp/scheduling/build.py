"""Config phase two: instantiate plugins, fill upstream's defaults, assemble the profile; and the default profile.

Defaults as upstream: a plugin's name is its type; a scorer's weight is 1; a profile without a picker gets a
max-score-picker; one profile with no profile handler runs as a single profile. `disagg-profile-handler` (and the
deprecated `pd-profile-handler`) runs a decode profile and, where its deciders approve, prefill and encode profiles
(`epp.scheduling.disagg`); every profile of such a config must be one of its stages.

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

from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from epp.config.durations import parse_duration
from epp.config.flowcontrol import FlowControlSpec
from epp.config.model import (
    DEFAULT_PARSERS,
    FLOW_CONTROL_GATE,
    EndpointPickerConfig,
    PluginSpec,
    ProfilePlugin,
    ProfileSpec,
)
from epp.datastore import Freshness
from epp.datastore.observations import ObservationSink
from epp.errors import ConfigError
from epp.scheduling.disagg import Decider, DisaggScheduler, Stage
from epp.scheduling.flow_plugins import flow_settings
from epp.scheduling.framework import Filter, Picker, PickObserver, Producer
from epp.scheduling.handler_factories import HandlerSpec
from epp.scheduling.knee import KneeDetector
from epp.scheduling.load_scorers import PrefillQueueScorer
from epp.scheduling.params import Params
from epp.scheduling.pickers import MaxScorePicker
from epp.scheduling.plugin_type import BuildContext, Built, Kind, Stability
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.producer_wiring import resolve_producers
from epp.scheduling.producers import ApproxPrefixCacheProducer, TokenProducer
from epp.scheduling.profile import ProfileScheduler, SchedulingProfile, WeightedScorer
from epp.scheduling.registry import Registry, builtin_registry
from epp.scheduling.saturation import (
    SATURATION_FILTER_TYPES,
    ConcurrencyDetector,
    SaturationDetector,
    SaturationFilter,
)
from epp.scheduling.scheduler import RenderSettings, Router, Scheduler
from epp.scheduling.slo import PredictedLatencyProducer
from epp.scheduling.upstream_types import describe_unimplemented

DEFAULT_SCORER_WEIGHT = 1.0


# The built-in profiles' prefix scorer: the self-contained form they were measured with (benchmarks/RESULTS.md),
# named by its block size; a file's `prefix-cache-scorer` without parameters reads a producer, as upstream's does.
_BUILT_IN_PARAMETERS = {"prefix-cache-scorer": {"blockSize": 64}}


def _config(source: str, profile: tuple[tuple[str, float | None], ...]) -> EndpointPickerConfig:
    plugins = tuple(PluginSpec(name=t, type=t, parameters=_BUILT_IN_PARAMETERS.get(t, {})) for t, _ in profile)
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


@dataclass(frozen=True, slots=True)
class EffectivePlugin:
    """One plugin as the picker runs it: its parameters after defaults; `implicit` when the file did not list it."""

    name: str
    type_name: str
    kind: Kind
    parameters: dict[str, Any]
    implicit: bool = False


def _instantiate(
    config: EndpointPickerConfig, registry: Registry, ctx: BuildContext, allow_experimental: bool
) -> Built:
    unknown = [spec for spec in config.plugins if registry.get(spec.type) is None]
    if unknown:
        listed = "; ".join(f"plugin '{s.name}': type '{s.type}'{describe_unimplemented(s.type)}" for s in unknown)
        raise ConfigError(
            f"{config.source}: {listed}: not implemented here (known types: {', '.join(registry.names())})"
        )
    built: Built = {}
    ctx.plugin_types.update((spec.name, spec.type) for spec in config.plugins)
    # Producers first, so a plugin whose parameters name one (upstream's pluginRef parameters) finds it built.
    order = sorted(config.plugins, key=lambda s: getattr(registry.get(s.type), "kind", None) is not Kind.PRODUCER)
    for spec in order:
        plugin_type = registry.get(spec.type)
        assert plugin_type is not None
        if plugin_type.stability is Stability.ALPHA and not allow_experimental:
            raise ConfigError(
                f"{config.source}: plugin '{spec.name}' (type: '{spec.type}') has Alpha stability level, but "
                "command line flag --allow-experimental-plugins is not set"
            )
        params = Params(spec.parameters, f"{config.source}: plugin '{spec.name}' ({spec.type})")
        plugin = plugin_type.factory(spec.name, params, ctx)
        if plugin_type.limitation:
            ctx.warn(f"plugin '{spec.name}' ({spec.type})", plugin_type.limitation)
        ctx.built[spec.name] = plugin
        built[spec.name] = (plugin_type.kind, plugin, spec, params)
    return {spec.name: built[spec.name] for spec in config.plugins}  # file order, as check-config prints it


def deprecations(config: EndpointPickerConfig, registry: Registry | None = None) -> list[str]:
    """Upstream's deprecation warnings for this file: its own (`config.warnings`) and each deprecated plugin type;
    then one line per plugin that loads but cannot do (all of) its job here (`BuildContext.warn`: a stand-in type,
    a setting that is not honoured, a stage whose decider is missing), for a config that builds."""
    registry = registry or builtin_registry()
    out = list(config.warnings)
    for spec in config.plugins:
        plugin_type = registry.get(spec.type)
        if plugin_type is not None and plugin_type.replaced_by:
            out.append(f"plugin '{spec.name}': type '{spec.type}' is deprecated, use '{plugin_type.replaced_by}'")
    try:
        out.extend(_build(config, 0, registry, allow_experimental=True)[2].warnings)
    except ConfigError:
        pass  # the caller reports the refusal itself
    return out


_EXTRACTING_PRODUCERS = ("precise-prefix-cache-producer", "mm-embeddings-cache-producer")


def _check_references(config: EndpointPickerConfig, built: Built) -> None:
    """What each section's pluginRef names must be of the right kind (decode checked that it exists)."""
    source = config.source
    for ref in config.parser_refs:
        if built[ref][0] is not Kind.PARSER:
            raise ConfigError(
                f"{source}: requestHandler.parsers, plugin '{ref}' ({built[ref][2].type}): is not a parser"
            )
    for ref in config.data_source_refs:
        kind, _, spec, _ = built[ref]
        # upstream lists the precise producer as the extractor of endpoint notifications (its feeder's membership),
        # and the multimodal producer as an extractor too
        if kind is not Kind.DATA_LAYER and spec.type not in _EXTRACTING_PRODUCERS:
            raise ConfigError(f"{source}: data layer, plugin '{ref}' ({spec.type}): is not a data source here")
    if config.discovery_ref is not None and built[config.discovery_ref][0] is not Kind.DISCOVERY:
        spec = built[config.discovery_ref][2]
        raise ConfigError(
            f"{source}: dataLayer.discovery, plugin '{spec.name}' ({spec.type}): is not an endpoint-discovery plugin"
        )
    for name, (kind, _, spec, _) in built.items():
        if kind is Kind.DISCOVERY and name != config.discovery_ref:
            raise ConfigError(
                f"{source}: plugin '{name}' ({spec.type}): an endpoint-discovery plugin needs dataLayer.discovery."
                f"pluginRef: {name}"
            )
    detector = config.saturation_detector_ref
    if (
        detector is not None
        and detector in built
        and not isinstance(built[detector][1], SaturationFilter | ConcurrencyDetector | KneeDetector)
    ):
        raise ConfigError(
            f"{source}: saturationDetector, plugin '{detector}' ({built[detector][2].type}): is not a detector"
        )


def _profile(
    config: EndpointPickerConfig,
    spec: ProfileSpec,
    built: Built,
    seed: int,
    ctx: BuildContext | None = None,
    consumers: list[object] | None = None,
) -> SchedulingProfile:
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    pickers: list[Picker] = []
    for ref in spec.plugins:
        kind, plugin, plugin_spec, _ = built[ref.plugin_ref]
        where = f"{config.source}: profile '{spec.name}', plugin '{ref.plugin_ref}' ({plugin_spec.type})"
        if ref.weight is not None and kind is not Kind.SCORER:
            raise ConfigError(f"{where}: a weight applies to scorers only; this plugin is a {kind.value}")
        if kind is Kind.FILTER:
            filters.append(plugin)  # type: ignore[arg-type]
        elif kind is Kind.SCORER:
            weight = DEFAULT_SCORER_WEIGHT if ref.weight is None else ref.weight
            scorers.append(WeightedScorer(plugin, weight))  # type: ignore[arg-type]
            if getattr(plugin, "also_filters", False):  # context-length-aware with enableFiltering
                filters.append(plugin)  # type: ignore[arg-type]
        elif kind is Kind.PICKER:
            pickers.append(plugin)  # type: ignore[arg-type]
        elif kind in (Kind.PRODUCER, Kind.PARSER, Kind.REQUEST_HOOK):
            # producers run for every pick whether a profile lists them or not; parsers and request hooks run
            # around the pick: upstream's profile keeps only its filters, scorers and picker, and so does this one
            continue
        else:
            raise ConfigError(f"{where}: a {kind.value} cannot be part of a profile")
    if len(pickers) > 1:
        names = ", ".join(p.name for p in pickers)
        raise ConfigError(f"{config.source}: profile '{spec.name}': more than one picker ({names})")
    picker = pickers[0] if pickers else MaxScorePicker(seed=seed)
    used: list[object] = [*filters, *(s.scorer for s in scorers), *(consumers or ())]
    producers = resolve_producers(config, built, ctx, used) if ctx is not None else []
    learners: list[object] = [*producers, *(s.scorer for s in scorers)]
    observers = tuple(cast(PickObserver, p) for p in learners if hasattr(p, "picked"))
    return SchedulingProfile(spec.name, tuple(filters), tuple(scorers), picker, observers, tuple(producers))


def _build(
    config: EndpointPickerConfig,
    seed: int | None,
    registry: Registry,
    allow_experimental: bool,
    freshness: Freshness | None = None,
) -> tuple[Scheduler, Built, BuildContext]:
    seeds = np.random.SeedSequence(seed)
    freshness = pool_freshness(config, freshness or Freshness())
    ctx = BuildContext(seed_sequence=seeds, saturation=config.saturation, freshness=freshness)
    built = _instantiate(config, registry, ctx, allow_experimental)
    handlers = [(name, spec) for name, (kind, _, spec, _) in built.items() if kind is Kind.PROFILE_HANDLER]
    if len(handlers) > 1:
        raise ConfigError(f"{config.source}: more than one profile handler ({', '.join(n for n, _ in handlers)})")
    handler = built[handlers[0][0]][1] if handlers else None
    _check_references(config, built)
    thresholds = config.saturation
    detector = built.get(config.saturation_detector_ref or "")
    pool_detector: SaturationDetector | ConcurrencyDetector | KneeDetector
    if detector is not None and isinstance(detector[1], ConcurrencyDetector | KneeDetector):
        pool_detector = detector[1]
        pool_detector.freshness = freshness
    else:
        if detector is not None and isinstance(detector[1], SaturationFilter):
            thresholds = detector[1].thresholds  # flowControl.saturationDetector names the pool's detector plugin
        pool_detector = SaturationDetector(thresholds, freshness)
    if isinstance(handler, HandlerSpec) and handler.decode is not None:
        staged = _disagg(config, handler, built, ctx, pool_detector)  # type: ignore[arg-type]
        return _scheduler(config, built, staged, staged.profiles, staged.describe(), staged.route), built, ctx
    if len(config.profiles) > 1:
        names = ", ".join(p.name for p in config.profiles)
        what = f"profile handler '{handler.name}'" if isinstance(handler, HandlerSpec) else "single-profile-handler"
        raise ConfigError(
            f"{config.source}: {len(config.profiles)} scheduling profiles ({names}): {what} runs exactly one; "
            "use disagg-profile-handler for prefill/decode profiles"
        )
    profile = _profile(config, config.profiles[0], built, ctx.next_seed(), ctx)
    single = ProfileScheduler(profile, pool_detector)  # type: ignore[arg-type]
    if isinstance(handler, HandlerSpec) and handler.primary_port:  # data-parallel-profile-handler
        ranks = DisaggScheduler(single, primary_port=handler.primary_port, name=handler.name)
        return _scheduler(config, built, ranks, ranks.profiles, ranks.describe(), ranks.route), built, ctx
    return _scheduler(config, built, single, (single,), profile.describe(), None), built, ctx


def _scheduler(
    config: EndpointPickerConfig,
    built: Built,
    handler: ProfileScheduler | DisaggScheduler,
    profiles: tuple[ProfileScheduler, ...],
    description: str,
    routing: Router | None,
) -> Scheduler:
    """The one result for every handler: what the callers read, decided here once."""
    flow = None
    if config.gate(FLOW_CONTROL_GATE):
        policies = {n: p for n, (kind, p, _, _) in built.items() if kind is Kind.FLOW_CONTROL}
        flow = flow_settings(config.source, config.flow_control or FlowControlSpec(), policies)  # type: ignore[arg-type]
    decode = profiles[0].profile
    precise = {id(p): p for r in profiles for p in r.profile.producers if isinstance(p, PrecisePrefixCacheProducer)}
    if len(precise) > 1:
        raise ConfigError(
            f"{config.source}: one precise-prefix-cache-producer per config: its feeder follows every endpoint"
        )
    prefix: dict[int, PrefixCacheScorer | ApproxPrefixCacheProducer] = {
        id(s.scorer): s.scorer for r in profiles for s in r.profile.scorers if isinstance(s.scorer, PrefixCacheScorer)
    }
    prefix.update(  # the producers that learn from picks: shared between workers and counted, as the scorers
        (id(p), p) for r in profiles for p in r.profile.producers if isinstance(p, ApproxPrefixCacheProducer)
    )
    latency = {id(p): p for r in profiles for p in r.profile.producers if isinstance(p, PredictedLatencyProducer)}
    knees = [plugin for _, plugin, _, _ in built.values() if isinstance(plugin, KneeDetector)]
    prefill = [s.scorer for s in decode.scorers if isinstance(s.scorer, PrefillQueueScorer)]
    # the observation feed's sinks (epp.datastore.observations): the latency model, self-calibrating-detector
    learners: tuple[ObservationSink, ...] = (*latency.values(), *knees)
    return Scheduler(
        handler=handler,
        saturation=handler.saturation,
        freshness=handler.freshness,
        saturation_leads=isinstance(profiles[0].saturation, ConcurrencyDetector),  # the pool's, unwrapped by P/D
        admitters=tuple(plugin for kind, plugin, _, _ in built.values() if kind is Kind.ADMITTER),  # type: ignore[misc]
        flow=flow,
        tokenizer=_render_settings(decode.producers),
        prefix_scorers=tuple(prefix.values()),
        response_headers=handler.response_headers if handler.writes_response_headers else None,
        routing=routing,
        detailed=handler.pick_detailed,
        description=description,
        profiles=profiles,
        kv_events=next(iter(precise.values()), None),
        learners=learners,
        uncached=next(iter(latency.values())).model.uncached if latency else prefill[0].uncached if prefill else None,
    )


def _render_settings(producers: tuple[Producer, ...]) -> RenderSettings | None:
    """The render endpoint of the profile's vllm token-producer, if it has one: the director's token ids."""
    for producer in producers:
        if isinstance(producer, TokenProducer) and producer.backend == "vllm":
            return RenderSettings(
                producer.url, producer.model_name, producer.timeout_s, producer.chat_timeout_s, producer.cache_size
            )
    return None


def _disagg(
    config: EndpointPickerConfig, handler: HandlerSpec, built: Built, ctx: BuildContext, saturation: SaturationDetector
) -> DisaggScheduler:
    """The stages of a disaggregating handler: each profile by name, each decider a decider plugin."""
    where = f"{config.source}: plugin '{handler.name}' ({handler.type_name})"
    by_name = {p.name: p for p in config.profiles}

    def decider(ref: str | None, field: str) -> Decider | None:
        if ref is None:
            return None
        if ref not in built or built[ref][0] is not Kind.DECIDER:
            what = f"is a {built[ref][0].value}" if ref in built else "is not defined in plugins"
            raise ConfigError(f"{where}: {field} '{ref}' {what}; a decider is needed (e.g. prefix-based-pd-decider)")
        return cast(Decider, built[ref][1])

    def profile(name: str, field: str, consumers: list[object]) -> ProfileScheduler:
        if name not in by_name:
            listed = ", ".join(by_name) or "none"
            raise ConfigError(f"{where}: {field} profile '{name}' is not in schedulingProfiles (profiles: {listed})")
        return ProfileScheduler(_profile(config, by_name[name], built, ctx.next_seed(), ctx, consumers), saturation)

    prefill_decider = decider(handler.prefill_decider, "deciders.prefill")
    encode_decider = decider(handler.encode_decider, "deciders.encode")
    assert handler.decode is not None
    consumers: list[object] = [d for d in (prefill_decider, encode_decider) if d is not None]
    decode = profile(handler.decode, "profiles.decode", consumers)
    used = {handler.decode}
    prefill = encode = None
    if prefill_decider is not None:
        prefill = Stage(profile(handler.prefill, "profiles.prefill", []), prefill_decider)
        used.add(handler.prefill)
    if encode_decider is not None:
        encode = Stage(profile(handler.encode, "profiles.encode", []), encode_decider)
        used.add(handler.encode)
    unused = [p.name for p in config.profiles if p.name not in used]
    if unused:  # upstream: "No deciders.prefill configured, P/D disaggregation disabled", and it runs decode only
        ctx.warn(
            f"plugin '{handler.name}' ({handler.type_name})",
            f"scheduling profile(s) {', '.join(unused)} never run: the handler runs {', '.join(sorted(used))} (a "
            "stage runs only with its decider in deciders.prefill / deciders.encode; without one that "
            "disaggregation is disabled, as upstream)",
        )
    return DisaggScheduler(decode, prefill, encode, handler.primary_port, handler.name)


def build_scheduler(
    config: EndpointPickerConfig | None = None,
    seed: int | None = 0,
    registry: Registry | None = None,
    freshness: Freshness | None = None,
    allow_experimental: bool = False,
) -> Scheduler:
    """Phase two: plugin objects from a decoded config (None → `default_config()`); raises ConfigError.

    The result is one `Scheduler` whatever the profile handler (`epp.scheduling.scheduler`); its `.saturation` is
    the pool's saturation detector built from the config's saturation detector (its plugin's thresholds, or the
    older top-level fields), for the director's shedding step and flow control. `freshness` is the pool's rule for
    usable data (`epp serve`: from --metrics-staleness-threshold and --metrics-max-failures); `pool_freshness`
    says how the config can change it. Alpha plugin types need `allow_experimental` (`--allow-experimental-plugins`).
    """
    config = config or default_config()
    return _build(config, seed, registry or builtin_registry(), allow_experimental, freshness)[0]


def pool_freshness(config: EndpointPickerConfig, flags: Freshness) -> Freshness:
    """The pool's one staleness threshold: the flag's, unless the config file gives upstream's saturation-only
    `metricsStalenessThreshold` (in `saturationDetector`, or as a utilization-detector plugin's parameter, upstream's
    newer place for it): then that, so an upstream config behaves as it did there. Different values in two places
    are refused: decisions, the detector and /debug/pool read the same data with one threshold."""
    given: dict[float, str] = {}
    if config.saturation.staleness_s is not None:
        given[config.saturation.staleness_s] = "saturationDetector.metricsStalenessThreshold"
    for spec in config.plugins:
        raw = spec.parameters.get("metricsStalenessThreshold") if spec.type in SATURATION_FILTER_TYPES else None
        if raw is None:
            continue
        try:
            given.setdefault(parse_duration(raw), f"plugin '{spec.name}' metricsStalenessThreshold")
        except ValueError:
            continue  # the plugin's own factory refuses it, naming the field
    if len(given) > 1:
        listed = ", ".join(f"{where} {seconds:g}s" for seconds, where in given.items())
        raise ConfigError(f"{config.source}: one staleness threshold per pool, the config gives several: {listed}")
    return replace(flags, staleness_s=next(iter(given))) if given else flags


def effective_plugins(
    config: EndpointPickerConfig, registry: Registry | None = None, allow_experimental: bool = False
) -> list[EffectivePlugin]:
    """Every plugin the picker runs for this config with its parameters after defaults, those it adds as upstream
    does (parsers, picker, profile handler, detector, metrics source and extractor) marked implicit."""
    registry = registry or builtin_registry()
    scheduler, built, _ = _build(config, 0, registry, allow_experimental)

    def reported(type_name: str) -> str:  # the type upstream's instance reports (decode-filter: by-label)
        plugin_type = registry.get(type_name)
        return (plugin_type.reported_type if plugin_type is not None else None) or type_name

    out = [
        EffectivePlugin(name, reported(spec.type), kind, dict(params.effective))
        for name, (kind, _, spec, params) in built.items()
    ]
    types = {spec.type for _, _, spec, _ in built.values()}

    def implicit(type_name: str, kind: Kind, parameters: dict[str, Any] | None = None) -> None:
        if type_name not in types:
            types.add(type_name)
            out.append(EffectivePlugin(type_name, type_name, kind, parameters or {}, implicit=True))

    listed = set(built)
    for producer in (p for stage in scheduler.profiles for p in stage.profile.producers):  # auto-created, as upstream
        if producer.name not in listed:  # by name: a second producer of a type (tiered prefix caches) is a line
            listed.add(producer.name)
            out.append(EffectivePlugin(producer.name, producer.type_name, Kind.PRODUCER, {}, implicit=True))
    if not any(kind is Kind.PROFILE_HANDLER for kind, *_ in built.values()):
        implicit("single-profile-handler", Kind.PROFILE_HANDLER)
    if not any(kind is Kind.PICKER for kind, *_ in built.values()):
        implicit("max-score-picker", Kind.PICKER, {"maxNumOfEndpoints": 1})
    for parser in () if config.parser_refs else DEFAULT_PARSERS:
        implicit(parser, Kind.PARSER)
    if config.saturation_detector_ref is None:
        t = config.saturation  # no detector plugin: the pool's detector has the config's thresholds
        implicit(
            "utilization-detector",
            Kind.FILTER,
            {
                "queueDepthThreshold": t.queue_depth,
                "kvCacheUtilThreshold": t.kv_util,
                "metricsStalenessThreshold": scheduler.freshness.staleness_s,
                "headroom": t.headroom,
            },
        )
    if config.inject_data_defaults:
        implicit("metrics-data-source", Kind.DATA_LAYER)
        implicit("core-metrics-extractor", Kind.DATA_LAYER)
    return out


def plugin_object(config: EndpointPickerConfig, name: str, registry: Registry | None = None) -> object:
    """One plugin of a config, built alone: for the composition root, which starts what a non-scheduling plugin
    (the file-discovery feeder) describes."""
    registry = registry or builtin_registry()
    spec = config.plugin(name)
    plugin_type = registry.get(spec.type)
    if plugin_type is None:
        raise ConfigError(f"{config.source}: plugin '{name}': type '{spec.type}': not implemented here")
    ctx = BuildContext(seed_sequence=np.random.SeedSequence(0), saturation=config.saturation)
    return plugin_type.factory(name, Params(spec.parameters, f"{config.source}: plugin '{name}' ({spec.type})"), ctx)
