"""Every metric name upstream's picker exports (llm-d-router `pkg/epp/metrics`, the names listed for its
ebab687927f5 tree) is exported by `epp serve`, or is listed here with the reason it is not."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import free_port, http_ok, running, serve_argv, wait_until

pytestmark = pytest.mark.process

# Prefix llm_d_epp_; counters as their sample names (…_total).
EXPORTED = [
    *(f"request_{n}" for n in ("total", "error_total", "duration_seconds", "size_bytes", "input_tokens")),
    *(f"request_{n}" for n in ("output_tokens", "cached_tokens", "running", "ntpot_seconds", "ttft_seconds")),
    "request_streaming_tpot_seconds", "request_streaming_itl_seconds", "response_size_bytes",
    *(f"{s}_{m}" for s in ("average", "std_dev") for m in ("kv_cache_utilization", "queue_size", "running_requests")),
    "ready_endpoints", "per_endpoint_queue_size",
    "scheduler_e2e_duration_seconds", "scheduler_attempts_total", "plugin_duration_seconds",
    "plugin_data_scope_violations_total", "request_processing_duration_seconds",
    "response_processing_duration_seconds", "info", "model_rewrite_decisions_total",
    "datalayer_poll_errors_total", "datalayer_extract_errors_total",
    "extproc_streams_inflight", "extproc_stream_duration_seconds", "extproc_streams_total",
    "prefix_indexer_size", "prefix_indexer_hit_ratio", "prefix_indexer_hit_bytes", "inflight_requests",
]  # fmt: skip

LEGACY = [
    "inference_objective_request_total", "inference_objective_request_error_total",
    "inference_objective_request_duration_seconds", "inference_objective_request_sizes",
    "inference_objective_response_sizes", "inference_objective_input_tokens", "inference_objective_output_tokens",
    "inference_objective_prompt_cached_tokens", "inference_objective_running_requests",
    "inference_objective_normalized_time_per_output_token_seconds",
    "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
    "inference_pool_average_running_requests", "inference_pool_ready_pods",
    "inference_extension_scheduler_e2e_duration_seconds", "inference_extension_scheduler_attempts_total",
    "inference_extension_plugin_duration_seconds", "inference_extension_info",
    "inference_extension_model_rewrite_decisions_total", "inference_extension_prefix_indexer_size",
    "inference_extension_prefix_indexer_hit_ratio", "inference_extension_prefix_indexer_hit_bytes",
    "llm_d_inference_scheduler_datalayer_poll_errors_total",
]  # fmt: skip

NOT_EXPORTED = {
    **{
        f"flow_control_{n}": "exported only with the flowControl feature gate on (epp/observability/flow.py)"
        for n in (
            "request_queue_duration_seconds", "dispatch_cycle_duration_seconds", "request_enqueue_duration_seconds",
            "queue_size", "queue_bytes", "pool_saturation", "stale_endpoints", "capacity_utilization_requests",
            "capacity_utilization_bytes", "global_capacity_utilization_requests",
            "global_capacity_utilization_bytes", "requests_total",
        )
    },
    **{
        f"flow_control_{n}": "exported only with flowControl.enableEviction on (epp/observability/flow.py)"
        for n in (
            "revocations_issued_total", "revocations_total", "reclaim_target", "pending_reclaim",
            "revocation_confirmation_seconds",
        )
    },
    "inflight_tokens": "tokens in flight are booked in the endpoint table for token-load-scorer, not exported yet",
    "kv_cache_events_*": "exported only with a precise-prefix-cache-producer configured (epp/app/kv_metrics.py)",
}  # fmt: skip


def _families(text: str) -> set[str]:
    """Sample names as they would be queried: `# TYPE x counter` → x_total, else the family name."""
    names = set()
    for kind_line in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name, kind = kind_line.groups()
        names.add(f"{name}_total" if kind == "counter" and not name.endswith("_total") else name)
    return names


def test_every_upstream_metric_name_is_exported_or_named_why_not(tmp_path: Path) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    argv = serve_argv(grpc_port, free_port(), metrics_port, "--static-endpoints", "127.10.0.1:8000")
    with running(argv, tmp_path / "serve.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            text = response.read().decode()
    exported = _families(text)
    missing = [n for n in (*(f"llm_d_epp_{n}" for n in EXPORTED), *LEGACY) if n not in exported]
    assert missing == []
    assert not any(f"llm_d_epp_{n}" in exported for n in NOT_EXPORTED)
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= exported
    assert 'llm_d_epp_info{build_ref="' in text
