"""The per-request series are plain counters collected at scrape time: the exposition must read as before."""

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
    assert value("inference_objective_request_total", {"model_name": "m1", "target_model_name": "m1"}) == 2
    assert value("inference_objective_request_total", {"model_name": "m1", "target_model_name": "m1-lora"}) == 1
    errors = {"model_name": "", "target_model_name": "", "error_code": "BadRequest"}
    assert value("inference_objective_request_error_total", errors) == 1


def test_routed_count_is_exposed_as_zero_before_the_first_request() -> None:
    _, registry = _metrics()
    assert registry.get_sample_value("epp_requests_total", {"outcome": "routed", "code": "OK"}) == 0


@pytest.mark.parametrize(
    ("seconds", "first_bucket"),
    [(0.00001, "2e-05"), (0.00002, "2e-05"), (0.000021, "5e-05"), (1.0, "1.0"), (3.0, "+Inf")],
    ids=["below-first", "on-a-bound", "just-above", "on-the-last", "beyond"],
)
def test_decision_latency_lands_in_the_first_bucket_whose_bound_it_does_not_exceed(
    seconds: float, first_bucket: str
) -> None:
    metrics, registry = _metrics()
    metrics.decision_latency(seconds)
    name = "inference_extension_scheduler_e2e_duration_seconds"
    bounds = ["2e-05", "5e-05", "0.0001", "0.0002", "0.0005", "0.001", "0.002", "0.005", "0.01", "0.05", "0.1"]
    bounds += ["1.0", "+Inf"]
    counts = [registry.get_sample_value(f"{name}_bucket", {"le": le}) for le in bounds]
    first = bounds.index(first_bucket)
    assert counts == [0.0] * first + [1.0] * (len(bounds) - first)  # cumulative, as Prometheus expects
    assert registry.get_sample_value(f"{name}_count") == 1
    assert registry.get_sample_value(f"{name}_sum") == pytest.approx(seconds)
