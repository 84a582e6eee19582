"""The picker's Prometheus metrics: upstream's `llm_d_epp_*` family, its deprecated names, and a few of our own.

`PickerMetrics` is what the protocol and the director report to (it implements their observer protocols), so the
hot path calls a few cheap methods and knows nothing of Prometheus. Names, types, buckets and labels are
upstream's (llm-d-router `pkg/epp/metrics`); docs/observability.md lists every series and what it means here.

Per-request numbers are plain counters and histograms (`plain.py`) kept per label set, turned into metric families
only when `/metrics` is scraped. The request path resolves a request's labels when it is decided (one dict hit for a
known route) and otherwise only keeps its raw numbers: the latencies, the record of a routed request at its end, a
count per route. They are folded into the series every `FOLD_EVERY` requests and whenever the series are read (a
scrape, a worker's exposition), each histogram's values in the order they were observed, so every count and every
sum is the one an observation per request would give. Refusals are counted at once: they add only ints, whose
sums do not depend on the order of the adds. The deprecated `inference_objective_*` / `inference_extension_*`
series are computed from the same numbers at scrape time (one implementation, two spellings).

Cardinality: model names and fairness ids come from clients, so they pass through `labels.BoundedLabel`; label
sets beyond `MAX_SERIES` collapse into one `other` series. `/metrics` stays bounded whatever clients send.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from epp.errors import ErrorCode
from epp.observability import buckets as b
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.labels import FAIRNESS_LIMIT, MODEL_LIMIT, OVERFLOW, BoundedLabel
from epp.observability.plain import PlainHistogram

DEFAULT_FAIRNESS_ID = "default-flow"  # upstream's flow when the request names none
MAX_SERIES = 1000  # distinct (model, target, fairness, priority) label sets; more go to one `other` set
FOLD_EVERY = 256  # routed requests (and decisions) held raw before their numbers are folded into the series
_MAX_RAW_CACHE = 4096  # label resolutions remembered by the raw request values (short values only)
_MAX_RAW_KEY_BYTES = 1024
_MODEL = ("model_name", "target_model_name")
_REQUEST = (*_MODEL, "fairness_id", "priority")


class LabelSource(Protocol):
    """Where the configured names come from (epp.datastore.objectives.ObjectiveStore fits): `version` changes
    whenever objectives or rewrites change."""

    @property
    def version(self) -> int: ...

    def objectives(self) -> dict[str, int]: ...

    def configured_models(self) -> set[str]: ...


class RequestRecord:
    """What one stream learns about its request, written by the stream as it goes; read once, when the request's
    numbers are folded into its series. Made by `PickerMetrics.request_started`, which sets every field (a class
    without `__init__`: the constructor's Python call cost more than its ten writes)."""

    __slots__ = (
        "done_at",
        "first_byte_at",
        "last_chunk_at",
        "received_at",
        "request_bytes",
        "response_bytes",
        "response_started_at",
        "series",
        "streaming",
        "tokens",
    )

    received_at: float
    request_bytes: int  # -1: no body seen
    response_bytes: int
    response_started_at: float  # -1: not yet (and so for the other times)
    first_byte_at: float
    last_chunk_at: float
    done_at: float
    tokens: tuple[int, int, int] | None  # (prompt, completion, cached; -1: not reported), None: no usage
    streaming: bool
    series: _Series | None  # set when the request is decided


class _Route:
    """The labels of one raw (model, target, fairness, objective, endpoint) resolved once: the series, the
    scheduler-attempt key and the rewrite pair, and the decisions made on it since the last fold."""

    __slots__ = ("attempt", "decided", "rewrite", "series")

    def __init__(self, series: _Series, attempt: tuple[str, str, str], rewrite: tuple[str, str] | None) -> None:
        self.series = series
        self.attempt = attempt
        self.rewrite = rewrite
        self.decided = 0


class _Series:
    """One label set's per-request numbers."""

    __slots__ = (
        "cached",
        "duration",
        "errors",
        "input",
        "itl",
        "ntpot",
        "output",
        "request_size",
        "response_size",
        "running",
        "total",
        "tpot",
        "ttft",
        "ttft_streaming",
    )

    def __init__(self) -> None:
        self.total = 0
        self.running = 0
        self.errors: dict[str, int] = {}
        self.duration = PlainHistogram(b.GENERAL_LATENCY)
        self.request_size = PlainHistogram(b.REQUEST_SIZE)
        self.response_size = PlainHistogram(b.RESPONSE_SIZE)
        self.input = PlainHistogram(b.INPUT_TOKENS)
        self.output = PlainHistogram(b.OUTPUT_TOKENS)
        self.cached = PlainHistogram(b.INPUT_TOKENS)
        self.ntpot = PlainHistogram(b.NTPOT)
        self.ttft = PlainHistogram(b.TTFT)
        self.ttft_streaming = PlainHistogram(b.TTFT)
        self.tpot = PlainHistogram(b.TPOT)
        self.itl = PlainHistogram(b.ITL)

    _HISTS = (
        "duration",
        "request_size",
        "response_size",
        "input",
        "output",
        "cached",
        "ntpot",
        "ttft",
        "ttft_streaming",
        "tpot",
        "itl",
    )

    def copy(self) -> _Series:
        new = _Series.__new__(_Series)
        new.total, new.running, new.errors = self.total, self.running, dict(self.errors)
        for name in self._HISTS:
            old: PlainHistogram = getattr(self, name)
            h = PlainHistogram.__new__(PlainHistogram)
            h.bounds, h.counts, h.sum = old.bounds, list(old.counts), old.sum
            setattr(new, name, h)
        return new


class _State:
    """Everything the per-request methods write; copied whole for an off-loop scrape (`PickerMetrics.freeze`)."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str, str], _Series] = {}
        self.by_outcome: dict[tuple[str, str], int] = {("routed", "OK"): 0}  # (outcome, code) → requests
        self.scheduler = PlainHistogram(b.SCHEDULER)
        self.request_processing = PlainHistogram(b.REQUEST_PROCESSING)
        self.response_processing = PlainHistogram(b.RESPONSE_PROCESSING)
        self.attempts: dict[tuple[str, str, str], int] = {}  # (status, target model, endpoint address) → count
        self.rewrites: dict[tuple[str, str], int] = {}  # (model, target) → rewrite decisions
        self.streams_inflight = 0
        self.stream_duration = PlainHistogram(b.STREAM_DURATION)
        self.streams: dict[str, int] = {}  # gRPC status code → completed streams

    def copy(self) -> _State:
        new = _State()
        new.series = {k: s.copy() for k, s in self.series.items()}
        new.by_outcome = dict(self.by_outcome)
        for name in ("scheduler", "request_processing", "response_processing", "stream_duration"):
            getattr(new, name).add(getattr(self, name))
        new.attempts = dict(self.attempts)
        new.rewrites = dict(self.rewrites)
        new.streams_inflight = self.streams_inflight
        new.streams = dict(self.streams)
        return new


class FreezableCollector(Collector):
    """A collector whose numbers live on the serving loop: `freeze()` (on the loop) copies them, and a `collect()`
    from any other thread reads that copy, so `/metrics` can render in a worker thread without a lock."""

    _frozen: Any = None
    _owner: int | None = None

    def freeze(self) -> None:
        self._frozen = self.snapshot()
        self._owner = threading.get_ident()

    def snapshot(self) -> Any:
        raise NotImplementedError

    def families(self, data: Any) -> Iterator[Metric]:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        frozen = self._frozen
        if frozen is not None and threading.get_ident() != self._owner:
            return self.families(frozen)
        return self.families(self.snapshot())


class LoopCollector(FreezableCollector):
    """Any collector that reads loop-owned state, made freezable: `freeze()` collects its families on the loop."""

    def __init__(self, inner: Collector) -> None:
        self._inner = inner

    def snapshot(self) -> list[Metric]:
        return list(self._inner.collect())

    def families(self, data: Any) -> Iterator[Metric]:
        return iter(data)


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
        self._state = _State()
        self._resolved: dict[tuple[str, str, str | None, str | None, str], _Route] = {}
        self._fold_every = fold_every
        self._latencies: list[float] = []  # decision latencies, not yet in the scheduler histogram
        self._processing: list[float] = []  # request processing times, likewise
        self._touched: list[_Route] = []  # routes with decisions not yet folded
        self._done: list[RequestRecord] = []  # routed requests that ended, not yet folded
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

    def _route(self, model: str, target: str, fairness: str | None, objective: str | None, address: str) -> _Route:
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
            if len(state.series) >= MAX_SERIES:
                key = (OVERFLOW, OVERFLOW, OVERFLOW, priority if len(priority) <= 11 else OVERFLOW)
                series = state.series.get(key)
            if series is None:
                series = state.series[key] = _Series()
        rewrite = (bound(model), bound(target)) if target != model and model else None
        route = _Route(series, ("success", bound(target), address), rewrite)
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
            _fold_routed(done, state.response_processing)

    def usage_invalid(self) -> None:
        self.usage_invalid_total.inc()

    def served_mismatch(self) -> None:
        self.mismatches.inc()

    def stream_refused(self, reason: str) -> None:
        self.stream_refusals.labels(reason).inc()

    # -- ext_proc streams ------------------------------------------------------------------------------------

    def stream_started(self) -> None:
        self._state.streams_inflight += 1

    def stream_finished(self, code: str, seconds: float) -> None:
        state = self._state
        state.streams_inflight -= 1
        state.stream_duration.observe(seconds)
        state.streams[code] = state.streams.get(code, 0) + 1

    # -- DecisionObserver -----------------------------------------------------------------------------------

    def degraded_decision(self, reason: str) -> None:
        self.degraded.labels(reason).inc()

    # -- collection -------------------------------------------------------------------------------------------

    def snapshot(self) -> _State:
        self._fold()
        return self._state.copy()

    def families(self, data: Any) -> Iterator[Metric]:
        state: _State = data
        yield from _request_families(state)
        yield from _legacy_request_families(state)
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

    def _decision_families(self, state: _State) -> Iterator[Metric]:
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


def _fold_routed(done: list[RequestRecord], response_processing: PlainHistogram) -> None:
    """Routed requests' numbers into their series, in the order the requests ended. Each `h.counts[...]` line is
    `PlainHistogram.observe` written out: a Python call per value cost more than the rest of the fold."""
    bucket = bisect.bisect_left
    for record in done:
        series = record.series
        assert series is not None
        series.running -= 1
        series.total += 1
        now = record.done_at
        size = record.request_bytes
        if size >= 0:
            h = series.request_size
            h.counts[bucket(h.bounds, size)] += 1
            h.sum += size
        duration = now - record.received_at
        h = series.duration
        h.counts[bucket(h.bounds, duration)] += 1
        h.sum += duration
        first = record.first_byte_at
        if first >= 0:
            size = record.response_bytes
            h = series.response_size
            h.counts[bucket(h.bounds, size)] += 1
            h.sum += size
        if record.response_started_at >= 0:
            h = response_processing
            value = now - record.response_started_at
            h.counts[bucket(h.bounds, value)] += 1
            h.sum += value
        if first >= 0:
            h = series.ttft_streaming if record.streaming else series.ttft
            value = first - record.received_at
            h.counts[bucket(h.bounds, value)] += 1
            h.sum += value
        tokens = record.tokens
        if tokens is None:
            continue
        prompt, output, cached = tokens
        if prompt > 0:
            h = series.input
            h.counts[bucket(h.bounds, prompt)] += 1
            h.sum += prompt
        if output > 0:
            h = series.output
            h.counts[bucket(h.bounds, output)] += 1
            h.sum += output
            value = duration / output
            h = series.ntpot
            h.counts[bucket(h.bounds, value)] += 1
            h.sum += value
            if record.streaming and first >= 0 and output > 1:
                value = (now - first) / (output - 1)
                h = series.tpot
                h.counts[bucket(h.bounds, value)] += 1
                h.sum += value
        if cached >= 0:
            h = series.cached
            h.counts[bucket(h.bounds, cached)] += 1
            h.sum += cached


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


def _request_families(state: _State) -> Iterator[Metric]:
    items = sorted(state.series.items())
    yield counter_family(
        "llm_d_epp_request",
        "Total number of processed requests.",
        _REQUEST,
        [(k, float(s.total)) for k, s in items],
    )
    yield counter_family(
        "llm_d_epp_request_error",
        "Total number of request errors.",
        (*_REQUEST, "error_code"),
        [((*k, code), float(n)) for k, s in items for code, n in sorted(s.errors.items())],
    )
    yield gauge_family(
        "llm_d_epp_request_running",
        "Current number of active running requests.",
        _REQUEST,
        [(k, float(s.running)) for k, s in items],
    )
    for name, attr, help_text in _HIST_FAMILIES:
        yield histogram_family(
            f"llm_d_epp_{name}",
            help_text,
            _REQUEST,
            [(k, getattr(s, attr)) for k, s in items if getattr(s, attr).count],
        )
    ttft = [((*k, "false"), s.ttft) for k, s in items if s.ttft.count]
    ttft += [((*k, "true"), s.ttft_streaming) for k, s in items if s.ttft_streaming.count]
    yield histogram_family(
        "llm_d_epp_request_ttft_seconds",
        "Time to first token in seconds, from request received to first response byte.",
        (*_REQUEST, "streaming"),
        sorted(ttft, key=lambda kv: kv[0]),
    )


def _by_model(series: Iterable[tuple[tuple[str, str, str, str], _Series]]) -> dict[tuple[str, str], list[_Series]]:
    grouped: dict[tuple[str, str], list[_Series]] = {}
    for (model, target, _, _), s in series:
        grouped.setdefault((model, target), []).append(s)
    return grouped


def _legacy_request_families(state: _State) -> Iterator[Metric]:
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
