"""The picker's Prometheus metrics, under upstream's names where upstream has one.

`PickerMetrics` is what the protocol and the director report to (it implements their observer protocols), so the
hot path calls a few cheap counter methods and knows nothing of Prometheus.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.errors import ErrorCode

_LATENCY_BUCKETS = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


class PickerMetrics:
    """Counters and histograms of requests, decisions and tokens; one instance per process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "epp_requests",
            "Requests the picker finished, by outcome (routed or refused) and error code (OK when routed).",
            ["outcome", "code"],
            registry=registry,
        )
        self.objective_requests = Counter(
            "inference_objective_request",
            "Requests routed, by the model the client asked for and the model the endpoint served.",
            ["model_name", "target_model_name"],
            registry=registry,
        )
        self.objective_errors = Counter(
            "inference_objective_request_error",
            "Requests refused, by model and error code.",
            ["model_name", "target_model_name", "error_code"],
            registry=registry,
        )
        self.decision_seconds = Histogram(
            "inference_extension_scheduler_e2e_duration_seconds",
            "Time from a complete request to a decision (parse, candidates, scheduling).",
            buckets=_LATENCY_BUCKETS,
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
        self.open_streams = Gauge("epp_open_streams", "ext_proc streams open now.", registry=registry)
        self._routed = self.requests.labels("routed", "OK")
        self._by_model: dict[tuple[str, str], Any] = {}  # label children, looked up once per model pair

    # StreamObserver -------------------------------------------------------------------------------------------

    def request_done(self, code: ErrorCode | None, model: str, target_model: str) -> None:
        if code is None:
            self._routed.inc()
            child = self._by_model.get((model, target_model))
            if child is None:
                child = self._by_model[(model, target_model)] = self.objective_requests.labels(model, target_model)
            child.inc()
        else:
            self.requests.labels("refused", code.label).inc()
            self.objective_errors.labels(model, target_model, code.label).inc()

    def decision_latency(self, seconds: float) -> None:
        self.decision_seconds.observe(seconds)

    def usage(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.input_tokens.labels(model).observe(prompt_tokens)
        self.output_tokens.labels(model).observe(completion_tokens)

    def served_mismatch(self) -> None:
        self.mismatches.inc()

    # DecisionObserver -----------------------------------------------------------------------------------------

    def degraded_decision(self, reason: str) -> None:
        self.degraded.labels(reason).inc()
