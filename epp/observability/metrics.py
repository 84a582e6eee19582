"""The picker's Prometheus metrics: upstream's `llm_d_epp_*` family, its deprecated names, and a few of our own.

`PickerMetrics` is what the protocol and the director report to (it implements their observer protocols), so the
hot path calls a few cheap methods and knows nothing of Prometheus. Names, types, buckets and labels are
upstream's (llm-d-router `pkg/epp/metrics`); docs/observability.md lists every series and what it means here.

Per-request numbers are plain counters and histograms (`plain.py`) kept per label set (`request_series.py`), turned
into metric families (`request_families.py`) only when `/metrics` is scraped. The request path resolves a request's
labels when it is decided (one dict hit for a known route) and otherwise only keeps its raw numbers: the latencies,
the record of a routed request at its end, a count per route. They are folded into the series every `FOLD_EVERY`
requests and whenever the series are read (a scrape, a worker's exposition), each histogram's values in the order
they were observed, so every count and every sum is the one an observation per request would give. Refusals are
counted at once: they add only ints, whose sums do not depend on the order of the adds. The deprecated
`inference_objective_*` / `inference_extension_*` series are computed from the same numbers at scrape time (one
implementation, two spellings).

Cardinality: model names and fairness ids come from clients, so they pass through `labels.BoundedLabel`; label
sets beyond `MAX_SERIES`, or past the client series' share of the page (`labels.CLIENT_SERIES_BYTES`), collapse
into one `other` series. `/metrics` stays bounded whatever clients send.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric

from epp.errors import ErrorCode
from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.labels import (
    CLIENT_SERIES_BYTES,
    FAIRNESS_LIMIT,
    MODEL_LIMIT,
    OVERFLOW,
    BoundedLabel,
    client_series_cost,
    without_client_values,
)
from epp.observability.request_families import legacy_request_families, request_families
from epp.observability.request_series import MetricsState, RequestRecord, Route, Series, fold_routed

# RequestRecord is named here too: the stream gets its record from PickerMetrics and imports its type from here.
__all__ = ["DEFAULT_FAIRNESS_ID", "FOLD_EVERY", "MAX_SERIES", "LabelSource", "PickerMetrics", "RequestRecord"]

DEFAULT_FAIRNESS_ID = "default-flow"  # upstream's flow when the request names none
MAX_SERIES = 1000  # distinct (model, target, fairness, priority) label sets; more go to one `other` set
FOLD_EVERY = 256  # routed requests (and decisions) held raw before their numbers are folded into the series
_MAX_RAW_CACHE = 4096  # label resolutions remembered by the raw request values (short values only)
_MAX_RAW_KEY_BYTES = 1024


class LabelSource(Protocol):
    """Where the configured names come from (epp.datastore.objectives.ObjectiveStore fits): `version` changes
    whenever objectives or rewrites change."""

    @property
    def version(self) -> int: ...

    def objectives(self) -> dict[str, int]: ...

    def configured_models(self) -> set[str]: ...


class PickerMetrics(FreezableCollector):
    """Counters and histograms of requests, decisions, streams and tokens; one instance per process."""

    def __init__(
        self,
        registry: CollectorRegistry,
        labels: LabelSource | None = None,
        endpoint_name: Callable[[str], tuple[str, str, str]] | None = None,
        fold_every: int = FOLD_EVERY,
    ) -> None:
        """`labels`: configured model names and objective priorities (none: no pinned names, priority 0);
        `endpoint_name`: address → (pod name, namespace, port) for the scheduler-attempt labels; `fold_every`:
        requests held raw before they are folded into the series (1: at once)."""
        self.registry = registry
        self._labels = labels
        self._labels_version = -1
        self._priorities: Mapping[str, int] = {}
        self._endpoint_name = endpoint_name or (lambda address: (address, "", address.rpartition(":")[2]))
        self.model_label = BoundedLabel(MODEL_LIMIT)
        self.fairness_label = BoundedLabel(FAIRNESS_LIMIT)
        self._client_bytes = 0  # the client series' estimated share of /metrics (labels.CLIENT_SERIES_BYTES)
        self._state = MetricsState()
        self._resolved: dict[tuple[str, str, str | None, str | None, str], Route] = {}
        self._fold_every = fold_every
        self._latencies: list[float] = []  # decision latencies, not yet in the scheduler histogram
        self._processing: list[float] = []  # request processing times, likewise
        self._touched: list[Route] = []  # routes with decisions not yet folded
        self._done: list[RequestRecord] = []  # routed requests that ended, not yet folded
        self.activity = 0  # grows with every report that changes a number: a serving worker's cue to send them
        registry.register(self)
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

    # -- labels ---------------------------------------------------------------------------------------------

    def _refresh_labels(self) -> None:
        source = self._labels
        if source is None:
            return
        self._labels_version = source.version
        self._priorities = source.objectives()
        self.model_label.pin(source.configured_models())
        self._resolved.clear()

    def _route(self, model: str, target: str, fairness: str | None, objective: str | None, address: str) -> Route:
        """The route of a request's labels, through the bounds; resolved once per distinct short raw key."""
        source = self._labels
        if source is not None and source.version != self._labels_version:
            self._refresh_labels()
        raw = (model, target, fairness, objective, address)
        route = self._resolved.get(raw)
        if route is not None:
            return route
        bound = self.model_label
        priority = str(self._priorities.get(objective, 0)) if objective else "0"
        key = (bound(model), bound(target), self.fairness_label(fairness or DEFAULT_FAIRNESS_ID), priority)
        state = self._state
        series = state.series.get(key)
        if series is None:
            cost = client_series_cost(bound, key, DEFAULT_FAIRNESS_ID)
            if len(state.series) >= MAX_SERIES:
                key = (OVERFLOW, OVERFLOW, OVERFLOW, priority if len(priority) <= 11 else OVERFLOW)
                series = state.series.get(key)
            elif self._client_bytes + cost > CLIENT_SERIES_BYTES:
                key = without_client_values(bound, key, DEFAULT_FAIRNESS_ID)
                series = state.series.get(key)
            else:
                self._client_bytes += cost
            if series is None:
                series = state.series[key] = Series()
        rewrite = (bound(model), bound(target)) if target != model and model else None
        route = Route(series, ("success", bound(target), address), rewrite)
        if len(model) + len(target) + len(fairness or "") + len(objective or "") <= _MAX_RAW_KEY_BYTES:
            if len(self._resolved) >= _MAX_RAW_CACHE:
                self._resolved.clear()
            self._resolved[raw] = route
        return route

    # -- StreamObserver ---------------------------------------------------------------------------------------

    def request_started(self, now: float) -> RequestRecord:
        record = RequestRecord()
        record.received_at = now
        record.request_bytes = record.response_bytes = -1
        record.response_started_at = record.first_byte_at = record.last_chunk_at = record.done_at = -1.0
        record.tokens = None
        record.streaming = False
        record.series = None
        return record

    def decided(
        self,
        record: RequestRecord | None,
        started: float,
        now: float,
        model: str,
        target: str,
        fairness_id: str | None,
        objective: str | None,
        address: str,
    ) -> None:
        """A decision was made at `now`, its scheduling having started at `started` (the scheduler latency): the
        request is running; request processing ends here."""
        try:
            route = self._resolved[model, target, fairness_id, objective, address]
        except KeyError:
            route = self._route(model, target, fairness_id, objective, address)
        source = self._labels
        if source is not None and source.version != self._labels_version:
            route = self._route(model, target, fairness_id, objective, address)
        self.activity += 1
        if not route.decided:
            self._touched.append(route)
        route.decided += 1
        latencies = self._latencies
        latencies.append(now - started)
        if record is not None:
            record.series = route.series
            self._processing.append(now - record.received_at)
        if len(latencies) >= self._fold_every:
            self._fold()

    def request_done(
        self,
        code: ErrorCode | None,
        model: str,
        target_model: str,
        record: RequestRecord | None = None,
        now: float = 0.0,
        fairness_id: str | None = None,
        objective: str | None = None,
    ) -> None:
        """The request ended: routed and answered (`code` None) or refused with `code`."""
        self.activity += 1
        if code is None and record is not None and record.series is not None:  # routed: folded later
            record.done_at = now
            done = self._done
            done.append(record)
            if len(done) >= self._fold_every:
                self._fold()
            return
        # Refused, or reported without a record: counted now. What this adds to a histogram is an int (bytes), so its
        # sum does not depend on the order of the adds, and nothing held for the fold needs to land first.
        state = self._state
        decided = record.series if record is not None else None
        if decided is not None:
            series = decided
            series.running -= 1
        else:
            series = self._route(model, target_model, fairness_id, objective, "").series
        series.total += 1
        if code is None:
            state.by_outcome[("routed", "OK")] += 1
        else:
            label = code.label
            outcome = ("refused", label)
            state.by_outcome[outcome] = state.by_outcome.get(outcome, 0) + 1
            series.errors[label] = series.errors.get(label, 0) + 1
            if code is ErrorCode.SERVICE_UNAVAILABLE and record is not None and decided is None:
                key = ("failure", self.model_label(target_model), "")
                state.attempts[key] = state.attempts.get(key, 0) + 1
        if record is not None and record.request_bytes >= 0:
            series.request_size.observe(record.request_bytes)

    def response_chunk(self, record: RequestRecord, now: float, size: int) -> None:
        """A response body chunk went by: first byte (TTFT), inter-chunk latency (ITL) for streams, size."""
        if record.first_byte_at < 0:
            record.first_byte_at = now
            record.response_bytes = size
        else:
            record.response_bytes += size
            if record.streaming and record.series is not None:
                record.series.itl.observe(now - record.last_chunk_at)
                self.activity += 1
        record.last_chunk_at = now

    def usage(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        record: RequestRecord | None = None,
        cached_tokens: int = -1,
    ) -> None:
        """Token counts as the model server reported them in `usage`; recorded when the request ends."""
        if record is None:  # a caller without a record: count it now, under the model's default labels (ints)
            self.activity += 1
            series = self._route(model, model, None, None, "").series
            if prompt_tokens > 0:
                series.input.observe(prompt_tokens)
            if completion_tokens > 0:
                series.output.observe(completion_tokens)
            return
        record.tokens = (prompt_tokens, completion_tokens, cached_tokens)

    # -- the fold ---------------------------------------------------------------------------------------------

    def _fold(self) -> None:
        """The raw numbers kept since the last fold into the series, each histogram's in the order observed."""
        state = self._state
        if self._latencies:
            latencies, self._latencies = self._latencies, []
            state.scheduler.observe_all(latencies)
        if self._processing:
            processing, self._processing = self._processing, []
            state.request_processing.observe_all(processing)
        if self._touched:
            touched, self._touched = self._touched, []
            attempts, rewrites = state.attempts, state.rewrites
            for route in touched:
                n, route.decided = route.decided, 0
                route.series.running += n
                attempts[route.attempt] = attempts.get(route.attempt, 0) + n
                if route.rewrite is not None:
                    rewrites[route.rewrite] = rewrites.get(route.rewrite, 0) + n
        if self._done:
            done, self._done = self._done, []
            state.by_outcome[("routed", "OK")] += len(done)
            fold_routed(done, state.response_processing)

    def usage_invalid(self) -> None:
        self.activity += 1
        self.usage_invalid_total.inc()

    def served_mismatch(self) -> None:
        self.activity += 1
        self.mismatches.inc()

    def stream_refused(self, reason: str) -> None:
        self.activity += 1
        self.stream_refusals.labels(reason).inc()

    # -- ext_proc streams ------------------------------------------------------------------------------------

    def stream_started(self) -> None:
        self.activity += 1
        self._state.streams_inflight += 1

    def stream_finished(self, code: str, seconds: float) -> None:
        self.activity += 1
        state = self._state
        state.streams_inflight -= 1
        state.stream_duration.observe(seconds)
        state.streams[code] = state.streams.get(code, 0) + 1

    # -- DecisionObserver -----------------------------------------------------------------------------------

    def degraded_decision(self, reason: str) -> None:
        self.activity += 1
        self.degraded.labels(reason).inc()

    # -- collection -------------------------------------------------------------------------------------------

    def folded(self) -> MetricsState:
        """The live numbers, everything held raw folded in; read on the loop that writes them (`snapshot`: a copy)."""
        self._fold()
        return self._state

    def snapshot(self) -> MetricsState:
        self._fold()
        return self._state.copy()

    def families(self, data: Any) -> Iterator[Metric]:
        state: MetricsState = data
        yield from request_families(state)
        yield from legacy_request_families(state)
        yield from self._decision_families(state)
        yield counter_family(
            "epp_requests",
            "Requests the picker finished, by outcome (routed or refused) and error code (OK when routed).",
            ("outcome", "code"),
            sorted(state.by_outcome.items()),
        )
        yield gauge_family(
            "llm_d_epp_extproc_streams_inflight",
            "Number of ext_proc gRPC streams currently open.",
            (),
            [((), float(state.streams_inflight))],
        )
        yield gauge_family("epp_open_streams", "ext_proc streams open now.", (), [((), float(state.streams_inflight))])
        yield histogram_family(
            "llm_d_epp_extproc_stream_duration_seconds",
            "Duration an ext_proc gRPC stream stays open, in seconds.",
            (),
            [((), state.stream_duration)],
        )
        yield counter_family(
            "llm_d_epp_extproc_streams",
            "Total ext_proc gRPC streams completed, by gRPC status code.",
            ("code",),
            sorted(((code,), n) for code, n in state.streams.items()),
        )

    def _decision_families(self, state: MetricsState) -> Iterator[Metric]:
        for prefix, deprecated in (("llm_d_epp", ""), ("inference_extension", "[Deprecated: use llm_d_epp_*] ")):
            yield histogram_family(
                f"{prefix}_scheduler_e2e_duration_seconds",
                f"{deprecated}End-to-end scheduling latency distribution in seconds (parse and decide).",
                (),
                [((), state.scheduler)],
            )
            attempts = []
            for (status, target, address), n in sorted(state.attempts.items()):
                name, namespace, port = self._endpoint_name(address) if address else ("", "", "")
                attempts.append(((status, target, name, namespace, port), float(n)))
            endpoint = ("endpoint_name",) if prefix == "llm_d_epp" else ("pod_name",)
            yield counter_family(
                f"{prefix}_scheduler_attempts",
                f"{deprecated}Total number of scheduling attempts.",
                ("status", "target_model_name", *endpoint, "namespace", "port"),
                attempts,
            )
            yield counter_family(
                f"{prefix}_model_rewrite_decisions",
                f"{deprecated}Total number of inference model rewrite decisions.",
                ("model_rewrite_name", "model_name", "target_model"),
                [(("", m, t), float(n)) for (m, t), n in sorted(state.rewrites.items())],
            )
        yield histogram_family(
            "llm_d_epp_request_processing_duration_seconds",
            "EPP request processing latency in seconds, from request receipt until the decision (admission included).",
            (),
            [((), state.request_processing)],
        )
        yield histogram_family(
            "llm_d_epp_response_processing_duration_seconds",
            "EPP response processing latency in seconds: from response headers to completion.",
            (),
            [((), state.response_processing)],
        )
