"""Which producer each consumer reads: a consumer's producer reference checked against the config, and the
producers upstream creates on its own (with defaults) for a consumer whose config names none.

A scorer or filter names its data producer in a parameter (`prefixMatchInfoProducerName`, ...); this is where that
name is resolved once, at build time, so a wrong reference is refused at load and a pick never looks one up.
"""

from __future__ import annotations

from typing import cast

from epp.config.model import EndpointPickerConfig
from epp.errors import ConfigError
from epp.scheduling.framework import Producer
from epp.scheduling.plugin_type import BuildContext, Built, Kind

# What a consumer's producer reference must name: attribute → producer types that publish that data; the first
# type is the one upstream auto-creates (with defaults) when the file names none.
_CONSUMES: dict[str, tuple[str, ...] | None] = {
    "producer": None,  # by plugin type, below
    "prefix_producer": ("approx-prefix-cache-producer", "burst-prefix-cache-producer", "precise-prefix-cache-producer"),
    "load_producer": ("inflight-load-producer",),
}
_PRODUCER_OF: dict[str, tuple[str, ...]] = {
    "prefix-cache-scorer": (
        "approx-prefix-cache-producer",
        "burst-prefix-cache-producer",
        "precise-prefix-cache-producer",
    ),
    "no-hit-lru-scorer": (
        "approx-prefix-cache-producer",
        "burst-prefix-cache-producer",
        "precise-prefix-cache-producer",
    ),
    "active-request-scorer": ("inflight-load-producer",),
    "token-load-scorer": ("inflight-load-producer",),
}
# Producers whose absence a consumer can live with (its fallback equals the default producer's output).
_FALLBACK_OK = ("inflight-load-producer",)


def resolve_producers(
    config: EndpointPickerConfig, built: Built, ctx: BuildContext, plugins: list[object]
) -> list[Producer]:
    """The config's producers plus those upstream auto-creates for a consumer that names none, in run order;
    a consumer naming a plugin that is not a producer of its data is refused."""
    out: dict[str, Producer] = {
        name: plugin  # type: ignore[misc]
        for name, (kind, plugin, _, _) in built.items()
        if kind is Kind.PRODUCER and hasattr(plugin, "produce")
    }
    embedded = {  # a plugin carrying its own producer (upstream's deprecated precise-prefix-cache-scorer)
        p.name: p for _, plugin, _, _ in built.values() if (p := getattr(plugin, "embedded_producer", None)) is not None
    }
    out.update(embedded)
    for plugin in plugins:
        for attribute, types in _CONSUMES.items():
            wanted = getattr(plugin, attribute, None)
            if not isinstance(wanted, str) or not wanted:
                continue
            types = types or _PRODUCER_OF.get(getattr(plugin, "type_name", ""))
            if types is None:
                continue
            where = f"{config.source}: plugin '{getattr(plugin, 'name', '?')}' ({getattr(plugin, 'type_name', '?')})"
            if wanted in built and wanted not in embedded:
                kind, _, spec, _ = built[wanted]
                if kind is not Kind.PRODUCER or spec.type not in types:
                    raise ConfigError(f"{where}: '{wanted}' ({spec.type}) is not a producer of {' or '.join(types)}")
                continue
            if wanted in out or wanted in _FALLBACK_OK:
                continue
            if wanted != types[0]:
                raise ConfigError(f"{where}: names producer '{wanted}', which the config does not define")
            factory = _AUTO_PRODUCERS.get(wanted)
            if factory is not None:  # one instance per config: every profile's picks credit the same index
                auto = ctx.built.get(_AUTO_KEY + wanted)
                if auto is None:
                    auto = ctx.built[_AUTO_KEY + wanted] = factory()
                out[wanted] = cast(Producer, auto)
    _auto_token_producer(out, ctx)
    _check_precise(out, ctx)
    return sorted(out.values(), key=lambda p: getattr(p, "ORDER", 50))


def _auto_token_producer(producers: dict[str, Producer], ctx: BuildContext) -> None:
    """A prefix producer consumes the prompt's tokens: with no token-producer in the config, upstream auto-creates
    one (the estimate backend), and so does this builder (one per config; the estimate is what a prefix producer
    computes without one, so this changes no decision)."""
    from epp.scheduling.producers import TokenProducer

    if any(isinstance(p, TokenProducer) for p in producers.values()):
        return
    if not any(getattr(p, "type_name", "") in _PRODUCER_OF["prefix-cache-scorer"] for p in producers.values()):
        return
    auto = ctx.built.get(_AUTO_KEY + "token-producer")
    if auto is None:
        auto = ctx.built[_AUTO_KEY + "token-producer"] = TokenProducer()
    producers["token-producer"] = cast(Producer, auto)


def _check_precise(producers: dict[str, Producer], ctx: BuildContext) -> None:
    """Precise prefix matching needs the engine's own token ids: a token producer with the vllm backend. Without
    one (upstream then estimates tokens too) the config loads and the producer matches on its approximate fallback."""
    from epp.scheduling.precise import PrecisePrefixCacheProducer
    from epp.scheduling.producers import TokenProducer

    for plugin in producers.values():
        if not isinstance(plugin, PrecisePrefixCacheProducer):
            continue
        tokens = [p for p in producers.values() if isinstance(p, TokenProducer)]
        vllm = [p for p in tokens if p.backend == "vllm"]
        if not vllm:
            named = f"token-producer '{tokens[0].name}' uses the estimate backend" if tokens else "no token-producer"
            ctx.warn(
                f"plugin '{plugin.name}' (precise-prefix-cache-producer)",
                f"{named}, whose token ids are not the engine's, so no block key matches an engine's KV events: "
                "every request uses the approximate fallback (set a token-producer's modelName and vllm.url, the "
                "model server's render endpoints)",
            )
        plugin.token_producer = (vllm or tokens)[0].name if tokens else "token-producer"


def _auto_approx_prefix() -> Producer:
    from epp.scheduling.producers import ApproxPrefixCacheProducer

    return ApproxPrefixCacheProducer()


_AUTO_PRODUCERS = {"approx-prefix-cache-producer": _auto_approx_prefix}
_AUTO_KEY = " auto:"  # ctx.built key of an auto-created producer (no plugin name has a space)
