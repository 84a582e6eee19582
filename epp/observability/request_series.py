"""The per-request numbers behind the request metrics: one stream's `RequestRecord`, one label set's `Series`,
the `Route` a request's raw labels resolve to, the whole `MetricsState` a scrape copies, and `fold_routed`, which
adds routed requests' numbers into their series in the order the requests ended (epp.observability.metrics holds
them raw until then)."""

from __future__ import annotations

import bisect

from epp.observability import buckets as b
from epp.observability.plain import PlainHistogram


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
    series: Series | None  # set when the request is decided


class Route:
    """The labels of one raw (model, target, fairness, objective, endpoint) resolved once: the series, the
    scheduler-attempt key and the rewrite pair, and the decisions made on it since the last fold."""

    __slots__ = ("attempt", "decided", "rewrite", "series")

    def __init__(self, series: Series, attempt: tuple[str, str, str], rewrite: tuple[str, str] | None) -> None:
        self.series = series
        self.attempt = attempt
        self.rewrite = rewrite
        self.decided = 0


class Series:
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

    def copy(self) -> Series:
        new = Series.__new__(Series)
        new.total, new.running, new.errors = self.total, self.running, dict(self.errors)
        for name in self._HISTS:
            old: PlainHistogram = getattr(self, name)
            h = PlainHistogram.__new__(PlainHistogram)
            h.bounds, h.counts, h.sum = old.bounds, list(old.counts), old.sum
            setattr(new, name, h)
        return new


class MetricsState:
    """Everything the per-request methods write; copied whole for an off-loop scrape (`PickerMetrics.freeze`)."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str, str], Series] = {}
        self.by_outcome: dict[tuple[str, str], int] = {("routed", "OK"): 0}  # (outcome, code) → requests
        self.scheduler = PlainHistogram(b.SCHEDULER)
        self.request_processing = PlainHistogram(b.REQUEST_PROCESSING)
        self.response_processing = PlainHistogram(b.RESPONSE_PROCESSING)
        self.attempts: dict[tuple[str, str, str], int] = {}  # (status, target model, endpoint address) → count
        self.rewrites: dict[tuple[str, str], int] = {}  # (model, target) → rewrite decisions
        self.streams_inflight = 0
        self.stream_duration = PlainHistogram(b.STREAM_DURATION)
        self.streams: dict[str, int] = {}  # gRPC status code → completed streams

    def copy(self, series: bool = True) -> MetricsState:
        """A copy whose numbers the original's later writes do not change; `series=False`: the totals only."""
        new = MetricsState()
        if series:
            new.series = {k: s.copy() for k, s in self.series.items()}
        new.by_outcome = dict(self.by_outcome)
        for name in ("scheduler", "request_processing", "response_processing", "stream_duration"):
            getattr(new, name).add(getattr(self, name))
        new.attempts = dict(self.attempts)
        new.rewrites = dict(self.rewrites)
        new.streams_inflight = self.streams_inflight
        new.streams = dict(self.streams)
        return new


def fold_routed(done: list[RequestRecord], response_processing: PlainHistogram) -> None:
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
