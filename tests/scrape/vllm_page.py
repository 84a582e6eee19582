"""A vLLM v1 /metrics page of realistic shape, for tests and benchmarks/scrape.py.

tests/data/metrics holds only partial vLLM pages (cut with `...`), so this builds a whole one from vLLM's
real metric names, label sets and histogram bucket boundaries: ~300 lines, most of them histogram buckets, like
the page notes/metrics.md measured. The signals the picker reads are parameters, so tests know what to expect.
"""

from __future__ import annotations

MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct",engine="0"'

_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    ],
    "vllm:inter_token_latency_seconds": [
        0.01,
        0.025,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
    ],
    "vllm:e2e_request_latency_seconds": [
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    ],
    "vllm:request_queue_time_seconds": [
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    ],
    "vllm:request_prefill_time_seconds": [
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    ],
    "vllm:request_decode_time_seconds": [
        0.3,
        0.5,
        0.8,
        1.0,
        1.5,
        2.0,
        2.5,
        5.0,
        10.0,
        15.0,
        20.0,
        30.0,
        40.0,
        50.0,
        60.0,
        120.0,
        240.0,
        480.0,
        960.0,
        1920.0,
        7680.0,
    ],
    "vllm:request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000],
    "vllm:request_generation_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000],
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "vllm:request_params_max_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000],
}


def vllm_page(
    waiting: float = 3,
    running: float = 8,
    kv_usage: float = 0.4375,
    running_adapters: str = "sql-lora,chat-lora",
    waiting_adapters: str = "",
    max_lora: int = 4,
    block_size: int = 16,
    num_blocks: int = 81767,
) -> str:
    out: list[str] = []

    def metric(name: str, typ: str, help_text: str, lines: list[str]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {typ}")
        out.extend(lines)

    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [f"vllm:num_requests_running{{{MODEL}}} {float(running)}"],
    )
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [f"vllm:num_requests_waiting{{{MODEL}}} {float(waiting)}"],
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        [f"vllm:kv_cache_usage_perc{{{MODEL}}} {kv_usage}"],
    )
    metric(
        "vllm:lora_requests_info",
        "gauge",
        "Running stats on lora requests.",
        [
            f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="sql-lora",'
            f'waiting_lora_adapters=""}} 1.7907e+09',
            f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running_adapters}",'
            f'waiting_lora_adapters="{waiting_adapters}"}} 1.7907001e+09',
        ],
    )
    for counter, value in (
        ("vllm:prefix_cache_queries_total", 5030.0),
        ("vllm:prefix_cache_hits_total", 3680.0),
        ("vllm:num_preemptions_total", 0.0),
        ("vllm:prompt_tokens_total", 148222.0),
        ("vllm:generation_tokens_total", 955311.0),
    ):
        metric(counter, "counter", "Counter.", [f"{counter}{{{MODEL}}} {value}"])
    metric(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        [
            f'vllm:request_success_total{{finished_reason="{r}",{MODEL}}} {v}'
            for r, v in (("stop", 6193.0), ("length", 5.0), ("abort", 28.0))
        ],
    )
    for hist, buckets in _HISTOGRAMS.items():
        lines = []
        count = 0.0
        for i, le in enumerate(buckets):
            count += float(i % 7)
            lines.append(f'{hist}_bucket{{le="{float(le)}",{MODEL}}} {count}')
        lines.append(f'{hist}_bucket{{le="+Inf",{MODEL}}} {count}')
        lines.append(f"{hist}_count{{{MODEL}}} {count}")
        lines.append(f"{hist}_sum{{{MODEL}}} {count * 0.731}")
        metric(hist, "histogram", "Histogram.", lines)
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
        [
            f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",calculate_kv_scales="False",'
            f'cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
            f'is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="{num_blocks}",'
            f'num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",'
            f'swap_space="4",swap_space_bytes="4294967296"}} 1.0'
        ],
    )
    return "\n".join(out) + "\n"
