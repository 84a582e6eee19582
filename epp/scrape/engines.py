"""Which series mean what, per model-server engine, and how a page becomes a `MetricsSample`.

The table follows the engines' published metric names (sample pages in tests/data/metrics). Engines rename
metrics (vLLM's `gpu_cache_usage_perc` became `kv_cache_usage_perc`; a router that kept the old name read 0 for
ever), so every signal lists alternatives, the first present wins, and a signal no alternative finds stays NaN:
unknown, never zero.

Several series can match one signal (vLLM data-parallel ranks carry `engine="0"`, `engine="1"`; pages carry one
series per model name). The rule per signal:
- only the series with the latest timestamp count, when the page has timestamps;
- waiting, running: summed (per-label splits of one queue);
- KV-cache usage, cache geometry: the maximum (the fullest rank is what admission runs into);
- `vllm:lora_requests_info`: its value is a timestamp, the series with the largest value wins (as upstream does);
- a series repeated with identical labels is a page error; the last one is kept.

Overrides come from the config file in upstream's `core-metrics-extractor` parameters (`engineConfigs`), see
`engines_from_config`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epp.config.model import EndpointPickerConfig
from epp.datastore.table import MetricsSample
from epp.errors import ConfigError
from epp.scrape.parse import PageParser, ParsedPage, Sample
from epp.scrape.validate import rejection

DEFAULT_ENGINE = "vllm"

_SPEC = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*")
_SPEC_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,"]*?))\s*(?:,|$)')


@dataclass(frozen=True, slots=True)
class SeriesSpec:
    """A metric name plus the labels a series must carry: upstream's spec string `name{label="value"}`."""

    name: str
    match: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> SeriesSpec:
        m = _SPEC.fullmatch(text)
        if m is None:
            raise ValueError(f'not a metric spec (want name or name{{label="value"}}): {text!r}')
        name, label_text = m.groups()
        pairs: list[tuple[str, str]] = []
        rest = (label_text or "").strip()
        while rest:
            lm = _SPEC_LABEL.match(rest)
            if lm is None or lm.end() == 0:
                raise ValueError(f"bad label selector in metric spec {text!r}")
            key, quoted, bare = lm.groups()
            value = quoted.replace('\\"', '"').replace("\\\\", "\\") if quoted is not None else bare.strip()
            pairs.append((key, value))
            rest = rest[lm.end() :].strip()
        return cls(name, tuple(pairs))

    def matches(self, sample: Sample) -> bool:
        labels = sample.labels
        return all(labels.get(k) == v for k, v in self.match)

    def __str__(self) -> str:
        if not self.match:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.match) + "}"


def _specs(*texts: str) -> tuple[SeriesSpec, ...]:
    return tuple(SeriesSpec.parse(t) for t in texts)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The series one engine exports for each signal; an empty tuple means the engine does not export it."""

    name: str
    waiting: tuple[SeriesSpec, ...] = ()
    running: tuple[SeriesSpec, ...] = ()
    kv_usage: tuple[SeriesSpec, ...] = ()
    lora: tuple[SeriesSpec, ...] = ()  # info series: labels max_lora, running/waiting_lora_adapters; value = time
    cache_info: tuple[SeriesSpec, ...] = ()  # info series: labels block_size|page_size, num_gpu_blocks|num_pages
    block_size: tuple[SeriesSpec, ...] = ()  # value series (engines without an info series)
    num_blocks: tuple[SeriesSpec, ...] = ()
    parser: PageParser = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups = (self.waiting, self.running, self.kv_usage, self.lora, self.cache_info, self.block_size)
        names = [spec.name for group in (*groups, self.num_blocks) for spec in group]
        object.__setattr__(self, "parser", PageParser(names))


BUILTIN_ENGINES: dict[str, EngineSpec] = {
    e.name: e
    for e in (
        EngineSpec(
            "vllm",
            waiting=_specs("vllm:num_requests_waiting"),
            running=_specs("vllm:num_requests_running"),
            kv_usage=_specs("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            lora=_specs("vllm:lora_requests_info"),
            cache_info=_specs("vllm:cache_config_info"),
        ),
        EngineSpec(
            "sglang",
            waiting=_specs("sglang:num_queue_reqs"),
            running=_specs("sglang:num_running_reqs"),
            kv_usage=_specs("sglang:token_usage"),
            cache_info=_specs("sglang:cache_config_info"),
        ),
        EngineSpec(
            "trtllm-serve",
            waiting=_specs("trtllm_num_requests_waiting"),
            running=_specs("trtllm_num_requests_running"),
            kv_usage=_specs("trtllm_kv_cache_utilization"),
            block_size=_specs("trtllm_kv_cache_tokens_per_block"),
            num_blocks=_specs("trtllm_kv_cache_max_blocks"),
        ),
        EngineSpec(
            "triton-tensorrt-llm",
            waiting=_specs('nv_trt_llm_request_metrics{request_type="waiting"}'),
            running=_specs('nv_trt_llm_request_metrics{request_type="scheduled"}'),
            kv_usage=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'),
            block_size=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}'),
            num_blocks=_specs('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}'),
        ),
        EngineSpec(
            "llamacpp",
            waiting=_specs("llamacpp:requests_deferred"),
            running=_specs("llamacpp:requests_processing"),
        ),
    )
}
ALIASES = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "trtllm": "trtllm-serve", "triton": "triton-tensorrt-llm"}


@dataclass(frozen=True, slots=True)
class EngineRegistry:
    """Engine name → spec; unknown engine labels fall back to the default engine (upstream does the same)."""

    engines: Mapping[str, EngineSpec] = field(default_factory=lambda: dict(BUILTIN_ENGINES))
    default: str = DEFAULT_ENGINE

    def for_engine(self, name: str | None) -> EngineSpec:
        key = (name or self.default).strip().lower()
        key = ALIASES.get(key, key)
        spec = self.engines.get(key)
        return spec if spec is not None else self.engines[self.default]


_CONFIG_FIELDS = {
    "queuedRequestsSpec": "waiting",
    "runningRequestsSpec": "running",
    "kvUsageSpec": "kv_usage",
    "loraSpec": "lora",
    "cacheInfoSpec": "cache_info",
    "blockSizeSpec": "block_size",
    "numBlocksSpec": "num_blocks",
}


def engines_from_config(parameters: Mapping[str, Any] | None, source: str = "config") -> EngineRegistry:
    """Build the registry from upstream's `core-metrics-extractor` parameters.

    Accepted keys: `defaultEngine`, `engineLabelKey` (discovery reads the label; only checked here) and
    `engineConfigs`, a list of `{name, queuedRequestsSpec, runningRequestsSpec, kvUsageSpec, loraSpec,
    cacheInfoSpec}` (plus our `blockSizeSpec`, `numBlocksSpec`). As upstream, an engine config replaces the
    built-in one of that name whole; an absent or empty spec disables the signal. A spec may list alternatives
    separated by `|` (first present wins). Errors raise ConfigError naming the field.
    """
    params = dict(parameters or {})
    where = f"{source}: core-metrics-extractor parameters"
    unknown = set(params) - {"defaultEngine", "engineLabelKey", "engineConfigs"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    engines = dict(BUILTIN_ENGINES)
    configs = params.get("engineConfigs")
    configs = [] if configs is None else configs
    if not isinstance(configs, list):
        raise ConfigError(f"{where}.engineConfigs: must be a list")
    for i, cfg in enumerate(configs):
        at = f"{where}.engineConfigs[{i}]"
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{at}: must be a mapping")
        name = cfg.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{at}.name: required, a non-empty string")
        extra = set(cfg) - set(_CONFIG_FIELDS) - {"name"}
        if extra:
            raise ConfigError(f"{at}: unknown field(s) {', '.join(sorted(extra))}")
        kwargs: dict[str, tuple[SeriesSpec, ...]] = {}
        for key, attr in _CONFIG_FIELDS.items():
            text = cfg.get(key) or ""
            if not isinstance(text, str):
                raise ConfigError(f"{at}.{key}: must be a string")
            try:
                kwargs[attr] = tuple(SeriesSpec.parse(t) for t in text.split("|") if t.strip())
            except ValueError as exc:
                raise ConfigError(f"{at}.{key}: {exc}") from None
        key = name.strip().lower()
        engines[key] = EngineSpec(key, **kwargs)
    default = params.get("defaultEngine", DEFAULT_ENGINE)
    if not isinstance(default, str) or default.strip().lower() not in engines:
        raise ConfigError(f"{where}.defaultEngine: unknown engine {default!r} (known: {', '.join(sorted(engines))})")
    label_key = params.get("engineLabelKey")
    if label_key is not None and not isinstance(label_key, str):
        raise ConfigError(f"{where}.engineLabelKey: must be a string")
    return EngineRegistry(engines, default.strip().lower())


# -- extraction ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Extraction:
    """What one page says, plus what was wrong with it (malformed or duplicate wanted series, refused values)."""

    sample: MetricsSample
    problems: tuple[str, ...]
    signals_found: int
    rejected: tuple[tuple[str, str], ...] = ()  # (signal, reason) of each value refused as implausible


def _series(page: ParsedPage, specs: tuple[SeriesSpec, ...], problems: list[str]) -> list[Sample]:
    """The matching series of the first alternative present: deduplicated, then only the latest timestamp."""
    for spec in specs:
        matching = [s for s in page.of(spec.name) if spec.matches(s)]
        if not matching:
            continue
        if len(matching) == 1:  # the common case: nothing to deduplicate or order
            return matching
        by_labels: dict[tuple[tuple[str, str], ...], Sample] = {}
        for s in matching:
            key = tuple(sorted(s.labels.items()))
            if key in by_labels:
                problems.append(f"duplicate series {spec.name}{dict(key)}")
            by_labels[key] = s
        chosen = list(by_labels.values())
        stamps = [s.timestamp for s in chosen if s.timestamp is not None]
        if stamps:
            latest = max(stamps)
            chosen = [s for s in chosen if s.timestamp == latest]
        return chosen
    return []


def _label_number(sample: Sample, *keys: str) -> float | None:
    """The first of the labels present, as a number (NaN when it does not parse); None when none is present."""
    for key in keys:
        text = sample.labels.get(key)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                return math.nan
    return None


class _Checker:
    """Refuses implausible values (epp/scrape/validate.py) and remembers why, per signal."""

    __slots__ = ("problems", "rejected")

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.rejected: list[tuple[str, str]] = []

    def values(self, signal: str, values: Iterable[float | None]) -> list[float] | None:
        """The values present, or None when any of them is refused (the signal is then unknown)."""
        out = []
        for value in values:
            if value is None:
                continue
            why = rejection(signal, value)
            if why is not None:
                self.rejected.append((signal, why))
                self.problems.append(f"{signal}: refused {why} value {value!r}")
                return None
            out.append(value)
        return out


def _adapters(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(a for a in (p.strip() for p in text.split(",")) if a)


def _max(values: list[float] | None) -> float:
    return max(values) if values else math.nan


def _sum(values: list[float] | None) -> float:
    return sum(values) if values is not None else math.nan


def extract(text: str, engine: EngineSpec) -> Extraction:
    """Read one page with an engine's mapping. Never raises on page content."""
    page = engine.parser.parse(text)
    problems: list[str] = []
    out = MetricsSample()
    found = 0

    check = _Checker(problems)
    waiting = _series(page, engine.waiting, problems)
    if waiting:
        out.waiting = _sum(check.values("waiting", (s.value for s in waiting)))
        found += 1
    running = _series(page, engine.running, problems)
    if running:
        out.running = _sum(check.values("running", (s.value for s in running)))
        found += 1
    kv = _series(page, engine.kv_usage, problems)
    if kv:
        out.kv_usage = _max(check.values("kv_usage", (s.value for s in kv)))
        found += 1
    lora = _series(page, engine.lora, problems)
    if lora:
        newest = max(lora, key=lambda s: s.value if not math.isnan(s.value) else -math.inf)
        out.max_lora = _max(check.values("max_lora", (_label_number(newest, "max_lora"),)))
        out.running_adapters = _adapters(newest.labels.get("running_lora_adapters"))
        out.waiting_adapters = _adapters(newest.labels.get("waiting_lora_adapters"))
        found += 1
    info = _series(page, engine.cache_info, problems)
    if info:
        out.block_size = _max(check.values("block_size", (_label_number(s, "block_size", "page_size") for s in info)))
        out.num_blocks = _max(
            check.values("num_blocks", (_label_number(s, "num_gpu_blocks", "num_pages") for s in info))
        )
        found += 1
    block_size = _series(page, engine.block_size, problems)
    if block_size:
        out.block_size = _max(check.values("block_size", (s.value for s in block_size)))
        found += 1
    num_blocks = _series(page, engine.num_blocks, problems)
    if num_blocks:
        out.num_blocks = _max(check.values("num_blocks", (s.value for s in num_blocks)))
        found += 1
    problems[:0] = [str(e) for e in page.errors]
    return Extraction(out, tuple(problems), found, tuple(check.rejected))


def engines_of_config(config: EndpointPickerConfig | None) -> EngineRegistry:
    """The engine table an EndpointPickerConfig asks for: its `core-metrics-extractor` plugin's parameters, else
    the built-in names. One place, so `epp check-config` and `epp serve` reach the same verdict."""
    if config is None:
        return EngineRegistry()
    extractor = next((p for p in config.plugins if p.type == "core-metrics-extractor"), None)
    return engines_from_config(extractor.parameters, config.source) if extractor is not None else EngineRegistry()
