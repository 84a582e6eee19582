"""The per-request series are plain counters collected at scrape time, under upstream's names, labels and buckets."""

import pytest
from prometheus_client import CollectorRegistry

from epp.errors import ErrorCode
from epp.observability.metrics import PickerMetrics


def _metrics() -> tuple[PickerMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return PickerMetrics(registry), registry


def test_requests_are_counted_by_outcome_code_and_model_pair() -> None:
    metrics, registry = _metrics()
    metrics.request_done(None, "m1", "m1")
    metrics.request_done(None, "m1", "m1-lora")
    metrics.request_done(None, "m1", "m1")
    metrics.request_done(ErrorCode.BAD_REQUEST, "", "")
    value = registry.get_sample_value
    assert value("epp_requests_total", {"outcome": "routed", "code": "OK"}) == 3
    assert value("epp_requests_total", {"outcome": "refused", "code": "BadRequest"}) == 1
    pair = {"model_name": "m1", "target_model_name": "m1"}
    assert value("inference_objective_request_total", {**pair, "priority": "0"}) == 2
    lora = {"model_name": "m1", "target_model_name": "m1-lora", "priority": "0"}
    assert value("inference_objective_request_total", lora) == 1
    errors = {"model_name": "", "target_model_name": "", "error_code": "BadRequest"}
    assert value("inference_objective_request_error_total", errors) == 1
    labels = {**pair, "fairness_id": "default-flow", "priority": "0"}
    assert value("llm_d_epp_request_total", labels) == 2
    refused = {"model_name": "", "target_model_name": "", "fairness_id": "default-flow", "priority": "0"}
    assert value("llm_d_epp_request_error_total", {**refused, "error_code": "BadRequest"}) == 1


def test_routed_count_is_exposed_as_zero_before_the_first_request() -> None:
    _, registry = _metrics()
    assert registry.get_sample_value("epp_requests_total", {"outcome": "routed", "code": "OK"}) == 0


def test_a_request_record_feeds_durations_sizes_tokens_and_the_running_gauge() -> None:
    metrics, registry = _metrics()
    record = metrics.request_started(10.0)
    record.request_bytes = 660
    metrics.decided(record, 10.0005, 10.001, "m1", "m1", "tenant-a", None, "127.10.0.1:8000")
    labels = {"model_name": "m1", "target_model_name": "m1", "fairness_id": "tenant-a", "priority": "0"}
    assert registry.get_sample_value("llm_d_epp_request_running", labels) == 1
    record.streaming = True
    metrics.response_chunk(record, 10.5, 100)
    metrics.response_chunk(record, 10.52, 100)
    metrics.usage("m1", 40, 11, record, cached_tokens=32)
    metrics.request_done(None, "m1", "m1", record, 12.0)
    value = registry.get_sample_value
    assert value("llm_d_epp_request_running", labels) == 0
    assert value("llm_d_epp_request_duration_seconds_sum", labels) == pytest.approx(2.0)
    assert value("llm_d_epp_request_size_bytes_bucket", {**labels, "le": "1024.0"}) == 1
    assert value("llm_d_epp_request_size_bytes_bucket", {**labels, "le": "512.0"}) == 0
    assert value("llm_d_epp_response_size_bytes_sum", labels) == 200
    assert value("llm_d_epp_request_input_tokens_sum", labels) == 40
    assert value("llm_d_epp_request_output_tokens_sum", labels) == 11
    assert value("llm_d_epp_request_cached_tokens_sum", labels) == 32
    assert value("llm_d_epp_request_ntpot_seconds_sum", labels) == pytest.approx(2.0 / 11)
    assert value("llm_d_epp_request_ttft_seconds_sum", {**labels, "streaming": "true"}) == pytest.approx(0.5)
    assert value("llm_d_epp_request_streaming_tpot_seconds_sum", labels) == pytest.approx(1.5 / 10)
    assert value("llm_d_epp_request_streaming_itl_seconds_sum", labels) == pytest.approx(0.02)
    assert value("llm_d_epp_request_processing_duration_seconds_count") == 1
    attempt = {"status": "success", "target_model_name": "m1", "endpoint_name": "127.10.0.1:8000"}
    assert value("llm_d_epp_scheduler_attempts_total", {**attempt, "namespace": "", "port": "8000"}) == 1


def test_objective_priority_and_rewrite_targets_come_from_the_label_source() -> None:
    class Source:
        version = 1

        def objectives(self) -> dict[str, int]:
            return {"batch": -1}

        def configured_models(self) -> set[str]:
            return {"m1", "m1-v2"}

    registry = CollectorRegistry()
    metrics = PickerMetrics(registry, labels=Source())
    record = metrics.request_started(0.0)
    metrics.decided(record, 0.0, 0.0, "m1", "m1-v2", None, "batch", "127.10.0.1:8000")
    metrics.request_done(None, "m1", "m1-v2", record, 1.0)
    labels = {"model_name": "m1", "target_model_name": "m1-v2", "fairness_id": "default-flow", "priority": "-1"}
    assert registry.get_sample_value("llm_d_epp_request_total", labels) == 1
    rewrite = {"model_rewrite_name": "", "model_name": "m1", "target_model": "m1-v2"}
    assert registry.get_sample_value("llm_d_epp_model_rewrite_decisions_total", rewrite) == 1


@pytest.mark.parametrize(
    ("seconds", "first_bucket"),
    [(0.00001, "0.0001"), (0.0001, "0.0001"), (0.000101, "0.0002"), (0.1, "0.1"), (3.0, "+Inf")],
    ids=["below-first", "on-a-bound", "just-above", "on-the-last", "beyond"],
)
@pytest.mark.parametrize(
    "name", ["llm_d_epp_scheduler_e2e_duration_seconds", "inference_extension_scheduler_e2e_duration_seconds"]
)
def test_decision_latency_lands_in_the_first_bucket_whose_bound_it_does_not_exceed(
    seconds: float, first_bucket: str, name: str
) -> None:
    metrics, registry = _metrics()
    started, now = 0.0, seconds
    metrics.decided(metrics.request_started(0.0), started, now, "m1", "m1", None, None, "127.10.0.1:8000")
    bounds = ["0.0001", "0.0002", "0.0005", "0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "+Inf"]
    counts = [registry.get_sample_value(f"{name}_bucket", {"le": le}) for le in bounds]
    first = bounds.index(first_bucket)
    assert counts == [0.0] * first + [1.0] * (len(bounds) - first)  # cumulative, as Prometheus expects
    assert registry.get_sample_value(f"{name}_count") == 1
    assert registry.get_sample_value(f"{name}_sum") == pytest.approx(seconds)


def test_stream_metrics_count_open_streams_durations_and_codes() -> None:
    metrics, registry = _metrics()
    metrics.stream_started()
    metrics.stream_started()
    assert registry.get_sample_value("llm_d_epp_extproc_streams_inflight") == 2
    metrics.stream_finished("OK", 0.02)
    metrics.stream_finished("Canceled", 3.0)
    assert registry.get_sample_value("llm_d_epp_extproc_streams_inflight") == 0
    assert registry.get_sample_value("llm_d_epp_extproc_streams_total", {"code": "OK"}) == 1
    assert registry.get_sample_value("llm_d_epp_extproc_streams_total", {"code": "Canceled"}) == 1
    assert registry.get_sample_value("llm_d_epp_extproc_stream_duration_seconds_bucket", {"le": "0.05"}) == 1
