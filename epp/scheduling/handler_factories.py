"""Factories of the profile-handler and decider types: which profiles a request runs, and when a disaggregated
stage (prefill, encode) runs.

A handler is kept as its configuration (`HandlerSpec`): the builder resolves the profile and decider names once
every plugin exists, because a decider may be listed after the handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.scheduling import disagg
from epp.scheduling.params import Params
from epp.scheduling.plugin_type import BuildContext


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A profile handler as configured: which profile each stage runs and which decider gates it. The builder
    resolves the names once every plugin exists (a decider may be listed after the handler)."""

    type_name: str
    name: str
    decode: str | None = None  # None: the config's one profile (single and data-parallel handlers)
    prefill: str = "prefill"
    encode: str = "encode"
    prefill_decider: str | None = None
    encode_decider: str | None = None
    primary_port: int = 0


# disagg-profile-handler's older flat parameters, which upstream still accepts (one format or the other, not both)
_FLAT = ("decodeProfile", "prefillProfile", "encodeProfile", "prefillDeciderPluginName", "encodeDeciderPluginName")


def _stage_order(params: Params) -> None:
    """Upstream's `stageOrder`: decode-first (the default, and the one order run here) or prefill-first."""
    raw = params.text("stageOrder", "")
    order = raw.lower().replace("-", "").replace("_", "")
    if order in ("", "decodefirst", "decode"):
        return
    if order in ("prefillfirst", "prefill"):
        raise params.error("stageOrder", "prefill-first is not implemented here: decode runs first (decode-first)")
    raise params.error("stageOrder", f"invalid stage order {raw!r}, must be 'decode-first' or 'prefill-first'")


def disagg_handler(name: str, params: Params, ctx: BuildContext) -> object:
    _stage_order(params)
    flat = [f for f in (*_FLAT, "deciderPluginName") if params.present(f)]
    if flat:  # upstream's deprecated flat format: the same settings, logged as deprecated there and here
        nested = [f for f in ("profiles", "deciders") if params.present(f)]
        if nested:
            raise params.error(flat[0], f"use one format: the flat fields or {' and '.join(nested)}, not both")
        ctx.warn(
            f"plugin '{name}' (disagg-profile-handler)",
            f"deprecated parameter(s) {', '.join(flat)}: use profiles.{{decode,prefill,encode}} and deciders",
        )
        decode = params.text("decodeProfile", "") or "decode"
        prefill = params.text("prefillProfile", "") or "prefill"
        encode = params.text("encodeProfile", "") or "encode"
        named, alias = params.text("prefillDeciderPluginName", ""), params.text("deciderPluginName", "")
        prefill_decider = named or alias or None  # deciderPluginName: pd-profile-handler's name, the lower priority
        encode_decider = params.text("encodeDeciderPluginName", "") or None
        params.finish()
        return HandlerSpec("disagg-profile-handler", name, decode, prefill, encode, prefill_decider, encode_decider)
    profiles = Params(params.section("profiles"), f"{params.where}: profiles")
    decode = profiles.text("decode", "decode")
    prefill = profiles.text("prefill", "prefill")
    encode = profiles.text("encode", "encode")
    profiles.finish()
    deciders = Params(params.section("deciders"), f"{params.where}: deciders")
    prefill_decider = deciders.text("prefill", "") or None
    encode_decider = deciders.text("encode", "") or None
    deciders.finish()
    params.finish()
    return HandlerSpec("disagg-profile-handler", name, decode, prefill, encode, prefill_decider, encode_decider)


def _port(params: Params, default: int) -> int:
    port = params.integer("primaryPort", default, minimum=0)
    if port > 65535:
        raise params.error("primaryPort", f"must be between 1 and 65535, got {port}")
    return port


def pd_handler(name: str, params: Params, ctx: BuildContext) -> object:
    """The deprecated `pd-profile-handler`: the disagg handler under its older parameter names."""
    decode = params.text("decodeProfile", "decode")
    prefill = params.text("prefillProfile", "prefill")
    decider = params.text("deciderPluginName", "prefix-based-pd-decider")
    if not decider:
        raise params.error("deciderPluginName", "decider plugin name is not defined")
    port = _port(params, 0)
    params.ignore("prefixPluginType", "prefixPluginName", "prefixMatchInfoProducerName")  # never used upstream
    params.finish()
    return HandlerSpec("pd-profile-handler", name, decode, prefill, prefill_decider=decider, primary_port=port)


def data_parallel_handler(name: str, params: Params, ctx: BuildContext) -> object:
    port = _port(params, 8000)
    params.finish()
    return HandlerSpec("data-parallel-profile-handler", name, primary_port=port)


def prefix_decider(name: str, params: Params, ctx: BuildContext) -> object:
    non_cached = params.integer("nonCachedTokens", 0, minimum=0)
    prompt = params.integer("promptTokens", 0, minimum=0)
    producer = params.text("prefixMatchInfoProducerName", disagg.DEFAULT_PREFIX_PRODUCER)
    params.finish()
    return disagg.PrefixBasedDecider(name, non_cached, prompt, producer)
