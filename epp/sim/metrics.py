"""The /metrics page of a simulated server, in the exposition format and metric names of each engine.

Names follow what the scraper reads (epp/scrape/engines.py: vLLM, SGLang, trtllm-serve, llama.cpp server), so
the picker's scraper reads a simulated pool exactly as it reads a real one. Rendering is plain string building: a
page is small, and the simulator serves many servers from one process, so prometheus_client's registry machinery
would only cost time.
The tests parse every page with prometheus_client's parser, the reference.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from epp.sim.engine import Engine

ENGINES = ("vllm", "sglang", "trtllm", "llamacpp")

# vLLM's buckets for time to first token and end-to-end latency (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


@dataclass(slots=True)
class Histogram:
    """A cumulative-bucket histogram; `observe` is O(log buckets)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out = [f"# TYPE {name} histogram"]
        running = 0
        for le, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{le="{le}"{sep}{labels}}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"{sep}{labels}}} {self.count}')
        brace = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{brace} {self.total}")
        out.append(f"{name}_count{brace} {self.count}")
        return out


@dataclass(slots=True)
class LatencyStats:
    """What the HTTP layer measures per server (the engine model itself keeps no wall-clock history)."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(kind: str, name: str, labels: str, value: float) -> list[str]:
    brace = f"{{{labels}}}" if labels else ""
    return [f"# TYPE {name} {kind}", f"{name}{brace} {float(value)}"]


def _counter(name: str, labels: str, value: float) -> list[str]:
    # The exposition names the family without `_total` and the sample with it.
    family = name.removesuffix("_total")
    brace = f"{{{labels}}}" if labels else ""
    return [f"# TYPE {family} counter", f"{family}_total{brace} {float(value)}"]


def render(
    engine_kind: str,
    model: str,
    engine: Engine,
    stats: LatencyStats,
    wall_time: float,
    lora_adapters: Sequence[str] = (),
) -> str:
    """The page for one server. `wall_time` stamps vllm:lora_requests_info (its value is a timestamp)."""
    m = f'model_name="{_escape(model)}"'
    e = engine
    p = engine.profile
    lines: list[str] = []
    if engine_kind == "vllm":
        lines += _sample("gauge", "vllm:num_requests_running", m, e.num_running)
        lines += _sample("gauge", "vllm:num_requests_waiting", m, e.num_waiting)
        lines += _sample("gauge", "vllm:kv_cache_usage_perc", m, e.kv_usage)
        lines += _counter("vllm:prefix_cache_queries_total", m, e.prefix_queries_tokens)
        lines += _counter("vllm:prefix_cache_hits_total", m, e.prefix_hits_tokens)
        lines += _counter("vllm:prompt_tokens_total", m, e.prompt_tokens_total)
        lines += _counter("vllm:generation_tokens_total", m, e.generation_tokens_total)
        lines += _counter("vllm:request_success_total", f'finished_reason="stop",{m}', e.requests_finished)
        cfg = f'block_size="{p.block_size}",enable_prefix_caching="True",num_gpu_blocks="{p.num_blocks}"'
        lines += _sample("gauge", "vllm:cache_config_info", cfg, 1.0)
        if lora_adapters:
            lora = (
                f'max_lora="{p.max_loras}",running_lora_adapters="{_escape(",".join(e.running_loras()))}",'
                f'waiting_lora_adapters="{_escape(",".join(e.waiting_loras()))}"'
            )
            lines += _sample("gauge", "vllm:lora_requests_info", lora, wall_time)
        lines += stats.ttft.lines("vllm:time_to_first_token_seconds", m)
        lines += stats.e2e.lines("vllm:e2e_request_latency_seconds", m)
    elif engine_kind == "sglang":
        lines += _sample("gauge", "sglang:num_running_reqs", m, e.num_running)
        lines += _sample("gauge", "sglang:num_queue_reqs", m, e.num_waiting)
        lines += _sample("gauge", "sglang:token_usage", m, e.kv_usage)
        hit = e.prefix_hits_tokens / e.prefix_queries_tokens if e.prefix_queries_tokens else 0.0
        lines += _sample("gauge", "sglang:cache_hit_rate", m, hit)
        lines += _sample(
            "gauge", "sglang:cache_config_info", f'num_pages="{p.num_blocks}",page_size="{p.block_size}"', 1
        )
        lines += _counter("sglang:prompt_tokens_total", m, e.prompt_tokens_total)
        lines += _counter("sglang:generation_tokens_total", m, e.generation_tokens_total)
        lines += _counter("sglang:cached_tokens_total", m, e.prefix_hits_tokens)
        lines += stats.ttft.lines("sglang:time_to_first_token_seconds", m)
        lines += stats.e2e.lines("sglang:e2e_request_latency_seconds", m)
    elif engine_kind == "trtllm":
        lines += _sample("gauge", "trtllm_num_requests_waiting", m, e.num_waiting)
        lines += _sample("gauge", "trtllm_num_requests_running", m, e.num_running)
        lines += _sample("gauge", "trtllm_kv_cache_utilization", m, e.kv_usage)
        lines += _sample("gauge", "trtllm_kv_cache_tokens_per_block", m, p.block_size)
        lines += _sample("gauge", "trtllm_kv_cache_max_blocks", m, p.num_blocks)
        lines += _counter("trtllm_request_success_total", m, e.requests_finished)
        lines += stats.ttft.lines("trtllm_time_to_first_token_seconds", m)
        lines += stats.e2e.lines("trtllm_e2e_request_latency_seconds", m)
    elif engine_kind == "llamacpp":  # llama.cpp's server exports no KV usage and no labels
        lines += _sample("gauge", "llamacpp:requests_processing", "", e.num_running)
        lines += _sample("gauge", "llamacpp:requests_deferred", "", e.num_waiting)
        lines += _counter("llamacpp:prompt_tokens_total", "", e.prompt_tokens_total)
        lines += _counter("llamacpp:tokens_predicted_total", "", e.generation_tokens_total)
    else:
        raise ValueError(f"unknown engine {engine_kind!r}; choose from {', '.join(ENGINES)}")
    lines.append("")
    return "\n".join(lines)
