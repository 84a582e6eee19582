"""The request series as metric families at scrape time: upstream's `llm_d_epp_request*` families, and the
deprecated `inference_objective_*` spellings computed from the same numbers (one implementation, two names)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.plain import PlainHistogram
from epp.observability.request_series import MetricsState, Series

_MODEL = ("model_name", "target_model_name")
REQUEST_LABELS = (*_MODEL, "fairness_id", "priority")


_HIST_FAMILIES = (
    ("request_duration_seconds", "duration", "End-to-end request latency distribution in seconds."),
    ("request_size_bytes", "request_size", "Incoming request body size distribution in bytes."),
    ("response_size_bytes", "response_size", "Outgoing response body size distribution in bytes."),
    ("request_input_tokens", "input", "Input token count distribution per request."),
    ("request_output_tokens", "output", "Output token count distribution per request."),
    (
        "request_cached_tokens",
        "cached",
        "Distribution of prompt tokens read from cache per request, as reported by the model server.",
    ),
    (
        "request_ntpot_seconds",
        "ntpot",
        "Normalized time per output token in seconds (end-to-end latency divided by output token count).",
    ),
    (
        "request_streaming_tpot_seconds",
        "tpot",
        "Average time per output token in seconds for streaming requests: (e2e - TTFT) / (output_tokens - 1).",
    ),
    (
        "request_streaming_itl_seconds",
        "itl",
        "Inter-token latency in seconds for streaming requests: time between consecutive response body chunks.",
    ),
)

# Deprecated upstream names: family → (attribute, help); labels model_name, target_model_name.
_LEGACY_HISTS = (
    ("inference_objective_request_duration_seconds", "duration", "Request latency in seconds."),
    ("inference_objective_request_sizes", "request_size", "Request body size in bytes."),
    ("inference_objective_response_sizes", "response_size", "Response body size in bytes."),
    ("inference_objective_input_tokens", "input", "Prompt tokens per request, as the model server reported."),
    ("inference_objective_output_tokens", "output", "Completion tokens per request, as the model server reported."),
    ("inference_objective_prompt_cached_tokens", "cached", "Cached prompt tokens per request."),
    ("inference_objective_normalized_time_per_output_token_seconds", "ntpot", "Latency per output token."),
)


def request_families(state: MetricsState) -> Iterator[Metric]:
    items = sorted(state.series.items())
    yield counter_family(
        "llm_d_epp_request",
        "Total number of processed requests.",
        REQUEST_LABELS,
        [(k, float(s.total)) for k, s in items],
    )
    yield counter_family(
        "llm_d_epp_request_error",
        "Total number of request errors.",
        (*REQUEST_LABELS, "error_code"),
        [((*k, code), float(n)) for k, s in items for code, n in sorted(s.errors.items())],
    )
    yield gauge_family(
        "llm_d_epp_request_running",
        "Current number of active running requests.",
        REQUEST_LABELS,
        [(k, float(s.running)) for k, s in items],
    )
    for name, attr, help_text in _HIST_FAMILIES:
        yield histogram_family(
            f"llm_d_epp_{name}",
            help_text,
            REQUEST_LABELS,
            [(k, getattr(s, attr)) for k, s in items if getattr(s, attr).count],
        )
    ttft = [((*k, "false"), s.ttft) for k, s in items if s.ttft.count]
    ttft += [((*k, "true"), s.ttft_streaming) for k, s in items if s.ttft_streaming.count]
    yield histogram_family(
        "llm_d_epp_request_ttft_seconds",
        "Time to first token in seconds, from request received to first response byte.",
        (*REQUEST_LABELS, "streaming"),
        sorted(ttft, key=lambda kv: kv[0]),
    )


def _by_model(series: Iterable[tuple[tuple[str, str, str, str], Series]]) -> dict[tuple[str, str], list[Series]]:
    grouped: dict[tuple[str, str], list[Series]] = {}
    for (model, target, _, _), s in series:
        grouped.setdefault((model, target), []).append(s)
    return grouped


def legacy_request_families(state: MetricsState) -> Iterator[Metric]:
    deprecated = "[Deprecated: use llm_d_epp_*] "
    items = sorted(state.series.items())
    totals: dict[tuple[str, str, str], float] = {}
    errors: dict[tuple[str, str, str], float] = {}
    running: dict[tuple[str], float] = {}
    for (model, target, _, priority), s in items:
        totals[(model, target, priority)] = totals.get((model, target, priority), 0.0) + s.total
        for code, n in s.errors.items():
            errors[(model, target, code)] = errors.get((model, target, code), 0.0) + n
        if model:
            running[(model,)] = running.get((model,), 0.0) + s.running
    yield counter_family(
        "inference_objective_request",
        deprecated + "Requests, by the model the client asked for and the model the endpoint served.",
        (*_MODEL, "priority"),
        sorted(totals.items()),
    )
    yield counter_family(
        "inference_objective_request_error",
        deprecated + "Requests refused, by model and error code.",
        (*_MODEL, "error_code"),
        sorted(errors.items()),
    )
    yield gauge_family(
        "inference_objective_running_requests",
        deprecated + "Running requests per model.",
        ("model_name",),
        sorted(running.items()),
    )
    grouped = _by_model(items)
    for name, attr, help_text in _LEGACY_HISTS:
        merged = []
        for pair, group in sorted(grouped.items()):
            total = PlainHistogram(getattr(group[0], attr).bounds)
            for s in group:
                total.add(getattr(s, attr))
            if total.count:
                merged.append((pair, total))
        yield histogram_family(name, deprecated + help_text, _MODEL, merged)
