"""The picker's Prometheus metrics, under upstream's names where upstream has one.

`PickerMetrics` is what the protocol and the director report to (it implements their observer protocols), so the
hot path calls a few cheap counter methods and knows nothing of Prometheus.

The three series every request touches (requests by outcome, routed requests by model, decision latency) are plain
Python counters turned into metric families only when `/metrics` is scraped: prometheus_client's children take a
lock per increment and its histogram walks the buckets in Python, several microseconds per request on the serving
loop. Everything is written and collected on that one loop, so the counters need no lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from epp.errors import ErrorCode

_LATENCY_BUCKETS = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


class _HotPathCollector(Collector):
    """Per-request counters kept as ints and floats, exposed in prometheus_client's format when collected."""

    def __init__(self) -> None:
        self.by_outcome: dict[tuple[str, str], int] = {}  # (outcome, code) → requests
        self.routed_by_model: dict[tuple[str, str], int] = {}  # (model, target model) → routed requests
        self.latency_counts = [0] * (len(_LATENCY_BUCKETS) + 1)  # per bucket (not cumulative), the last is +Inf
        self.latency_sum = 0.0

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "epp_requests",
            "Requests the picker finished, by outcome (routed or refused) and error code (OK when routed).",
            labels=["outcome", "code"],
        )
        for (outcome, code), count in sorted(self.by_outcome.items()):
            requests.add_metric([outcome, code], count)
        yield requests
        by_model = CounterMetricFamily(
            "inference_objective_request",
            "Requests routed, by the model the client asked for and the model the endpoint served.",
            labels=["model_name", "target_model_name"],
        )
        for (model, target), count in sorted(self.routed_by_model.items()):
            by_model.add_metric([model, target], count)
        yield by_model
        cumulative, buckets = 0, []
        for bound, count in zip((*map(floatToGoString, _LATENCY_BUCKETS), "+Inf"), self.latency_counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time from a complete request to a decision (parse, candidates, scheduling).",
            buckets=buckets,
            sum_value=self.latency_sum,
        )


class PickerMetrics:
    """Counters and histograms of requests, decisions and tokens; one instance per process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._hot = _HotPathCollector()
        registry.register(self._hot)
        self.objective_errors = Counter(
            "inference_objective_request_error",
            "Requests refused, by model and error code.",
            ["model_name", "target_model_name", "error_code"],
            registry=registry,
        )
        self.input_tokens = Histogram(
            "inference_objective_input_tokens",
            "Prompt tokens per request, as the model server reported in `usage`.",
            ["model_name"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Histogram(
            "inference_objective_output_tokens",
            "Completion tokens per request, as the model server reported in `usage`.",
            ["model_name"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.degraded = Counter(
            "epp_degraded_decisions",
            "Decisions made without the configured scheduler (FailOpen after an internal failure), by reason.",
            ["reason"],
            registry=registry,
        )
        self.mismatches = Counter(
            "epp_served_endpoint_mismatch",
            "Responses the gateway reports as served by an endpoint the picker did not name.",
            registry=registry,
        )
        self.usage_invalid_total = Counter(
            "epp_response_usage_invalid",
            "Responses whose `usage` counts could not be true (negative, fractional, strings, huge); not recorded.",
            registry=registry,
        )
        self.stream_refusals = Counter(
            "epp_stream_refusals",
            "ext_proc streams refused or ended by a server bound, by reason (stream_cap, idle_timeout, body_budget).",
            ["reason"],
            registry=registry,
        )
        self.open_streams = Gauge("epp_open_streams", "ext_proc streams open now.", registry=registry)
        self._by_outcome = self._hot.by_outcome
        self._routed_by_model = self._hot.routed_by_model
        self._by_outcome[("routed", "OK")] = 0

    # StreamObserver -------------------------------------------------------------------------------------------

    def request_done(self, code: ErrorCode | None, model: str, target_model: str) -> None:
        if code is None:
            outcome: tuple[str, str] = ("routed", "OK")
            pair = (model, target_model)
            self._routed_by_model[pair] = self._routed_by_model.get(pair, 0) + 1
        else:
            outcome = ("refused", code.label)
            self.objective_errors.labels(model, target_model, code.label).inc()
        self._by_outcome[outcome] = self._by_outcome.get(outcome, 0) + 1

    def decision_latency(self, seconds: float) -> None:
        hot = self._hot
        hot.latency_counts[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1  # le: a value on a bound is in it
        hot.latency_sum += seconds

    def usage(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.input_tokens.labels(model).observe(prompt_tokens)
        self.output_tokens.labels(model).observe(completion_tokens)

    def usage_invalid(self) -> None:
        self.usage_invalid_total.inc()

    def served_mismatch(self) -> None:
        self.mismatches.inc()

    def stream_refused(self, reason: str) -> None:
        self.stream_refusals.labels(reason).inc()

    # DecisionObserver -----------------------------------------------------------------------------------------

    def degraded_decision(self, reason: str) -> None:
        self.degraded.labels(reason).inc()
