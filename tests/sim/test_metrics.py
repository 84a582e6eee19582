"""Every engine's page parses with prometheus_client and carries that engine's names for the picker's signals."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.sim.engine import Engine, SimRequest
from epp.sim.metrics import ENGINES, LatencyStats, render
from epp.sim.profiles import H100_LLAMA_8B

# The names the picker reads per engine (epp/scrape/engines.py): waiting, running, KV usage (None: not exported).
SIGNALS = {
    "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    "trtllm": ("trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_utilization"),
    "llamacpp": ("llamacpp:requests_deferred", "llamacpp:requests_processing", None),
}


def busy_engine() -> Engine:
    """One request running (past its prefill), two waiting behind a one-sequence batch."""
    engine = Engine(dataclasses.replace(H100_LLAMA_8B, max_num_seqs=1))
    for i in range(3):
        engine.submit(SimRequest(i, 1024, 50), 0.0)
    engine.end_step(engine.begin_step(0.0))
    return engine


@pytest.mark.parametrize("engine_kind", ENGINES)
def test_page_parses_and_reports_queue_running_and_kv(engine_kind: str) -> None:
    stats = LatencyStats()
    stats.ttft.observe(0.03)
    stats.e2e.observe(2.0)
    page = render(engine_kind, "m", busy_engine(), stats, 1_700_000_000.0, lora_adapters=("a",))
    values = {s.name: s.value for fam in text_string_to_metric_families(page) for s in fam.samples}
    waiting, running, kv = SIGNALS[engine_kind]
    assert values[waiting] == 2
    assert values[running] == 1
    if kv is not None:
        assert 0 < values[kv] < 1


def test_vllm_lora_info_value_is_the_timestamp() -> None:
    page = render("vllm", "m", busy_engine(), LatencyStats(), 1_700_000_123.0, lora_adapters=("a", "b"))
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    sample = fams["vllm:lora_requests_info"].samples[0]
    assert sample.value == 1_700_000_123.0
    assert sample.labels["max_lora"] == "4"


def test_histogram_buckets_are_cumulative() -> None:
    stats = LatencyStats()
    for v in (0.003, 0.03, 0.3, 30.0):
        stats.ttft.observe(v)
    page = render("vllm", "m", Engine(H100_LLAMA_8B), stats, 0.0)
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    buckets = [s for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and counts[-1] == 4
    assert next(s.value for s in buckets if s.labels["le"] == "0.05" or s.labels["le"] == "0.06") == 2


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown engine"):
        render("tgi", "m", Engine(H100_LLAMA_8B), LatencyStats(), 0.0)
