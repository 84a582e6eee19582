"""OpenTelemetry traces with `--tracing`: an optional extra (`pip install 'epp-picker[tracing]'`), nothing on the
hot path without it.

What is traced, per request (all spans `INTERNAL` but the first):

- `epp.request` (SERVER): from the decision to the end of the ext_proc stream (response done or stream closed);
  `epp.request_id`, `gen_ai.request.model`, `epp.endpoint`, `epp.target_model`, an error status on a refusal;
- `epp.decision`: the director's decision (rewrite, admission, scheduling); `epp.endpoint`;
- `epp.scheduling`: one scheduling profile's run; `epp.profile` (its plugins), `epp.candidates`;
- `epp.plugin.filter`, `epp.plugin.scorer`, `epp.plugin.picker`: each plugin of the profile; `epp.plugin.name`,
  `epp.plugin.type`.

A request refused before the director (a body that does not parse) has no span.

W3C trace context: a `traceparent` (and `tracestate`) the request carries is continued (the request span is its
child), and the gateway forwards the request with a `traceparent` naming the picker's request span, so the model
server's spans hang below the picker's.

Configuration is the standard OpenTelemetry environment: `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (read
by the SDK; default `parentbased_always_on`), `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (default service
name `epp`), `OTEL_TRACES_EXPORTER` (`otlp`, the default, `console` or `none`) and the OTLP exporter's own
`OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, TLS; gRPC protocol).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from epp.datastore import Snapshot
from epp.datastore.table import FloatArray, IntArray
from epp.director import Decision, Director
from epp.director.decision import Timing
from epp.errors import EppError
from epp.requests import InferenceRequest
from epp.scheduling.framework import CycleState, SchedulingRequest
from epp.scheduling.pick_detail import PickDetail
from epp.scheduling.profile import ProfileScheduler, SchedulingProfile, WeightedScorer
from epp.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_MAX_OPEN = 100_000  # request spans awaiting their stream's end; a safety bound, streams always complete


def provider_from_env(exporter: SpanExporter | None = None, worker: int | None = None) -> TracerProvider:
    """A tracer provider configured from the OTEL_* variables (see the module docstring). A serving worker of
    `--workers N` exports its own spans with the same resource plus `epp.worker` (its index) and `process.pid`
    (OpenTelemetry's resource convention for the process), so a trace backend tells the workers apart."""
    attributes: dict[str, str | int] = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "epp"}
    if worker is not None:
        attributes.update({"epp.worker": worker, "process.pid": os.getpid()})
    provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER(_ARG)
    if exporter is None:
        exporter = _exporter_from_env()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter_from_env() -> SpanExporter | None:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (otlp, console, none): using otlp", name)
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "--tracing: the OTLP exporter is not installed (pip install 'epp-picker[tracing]'); spans go nowhere"
        )
        return None
    return OTLPSpanExporter()


class TracingDirector:
    """The director with a request span and a decision span around each decision (same interface)."""

    def __init__(self, director: Director, tracer: Tracer) -> None:
        self._director = director
        self._tracer = tracer
        self._open: dict[int, tuple[Decision, Span]] = {}
        self.pipeline = director.pipeline.around(self.decide, self.complete)  # the same stages, these spans

    def __getattr__(self, name: str) -> Any:  # table, candidates … as the director has them
        return getattr(self._director, name)

    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision:
        parent = _PROPAGATOR.extract(request.headers)
        span = self._tracer.start_span(
            "epp.request",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"epp.request_id": request.request_id, "gen_ai.request.model": request.model},
        )
        context = trace.set_span_in_context(span)
        try:
            with self._tracer.start_as_current_span("epp.decision", context=context) as decision_span:
                decision = self._director.decide(request, subset)
                decision_span.set_attribute("epp.endpoint", decision.header_value)
        except EppError as err:
            span.set_status(Status(StatusCode.ERROR, err.body))
            span.set_attribute("http.response.status_code", err.code.http_status)
            span.end()
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.end()
            raise
        span.set_attribute("epp.endpoint", decision.header_value)
        if decision.target_model:
            span.set_attribute("epp.target_model", decision.target_model)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=context)
        decision = decision._replace(headers=(*decision.headers, *carrier.items()))
        if len(self._open) >= _MAX_OPEN:
            self._open.clear()
        self._open[id(decision)] = (decision, span)
        return decision

    def complete(self, decision: Decision, timing: Timing | None = None) -> None:
        try:
            self._director.complete(decision, timing)
        finally:
            entry = self._open.pop(id(decision), None)
            if entry is not None:
                entry[1].end()


class _Traced:
    """A plugin with a span around each call; every other attribute is the plugin's own."""

    def __init__(self, plugin: Any, tracer: Tracer, role: str) -> None:
        self._plugin = plugin
        self._tracer = tracer
        self._span_name = f"epp.plugin.{role}"
        self._attributes = {"epp.plugin.name": str(plugin.name), "epp.plugin.type": str(plugin.type_name)}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plugin, name)

    def _span(self) -> Any:
        return self._tracer.start_as_current_span(self._span_name, attributes=self._attributes)


class _TracedFilter(_Traced):
    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        with self._span() as span:
            out: IntArray = self._plugin.filter(state, candidates)
            span.set_attribute("epp.candidates_out", int(out.size))
            return out


class _TracedScorer(_Traced):
    def __init__(self, plugin: Any, tracer: Tracer) -> None:
        super().__init__(plugin, tracer, "scorer")
        if getattr(plugin, "linear", None) is not None:  # a LinearScorer: the runner reads its `linear` form
            self.linear = self._linear

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        with self._span():
            out: FloatArray = self._plugin.score(state, candidates)
            return out

    def _linear(self, state: CycleState, candidates: IntArray) -> Any:
        with self._span():
            return self._plugin.linear(state, candidates)


class _TracedPicker(_Traced):
    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]:
        with self._span():
            out: Sequence[int] = self._plugin.pick(state, candidates, scores)
            return out


def traced_scheduler(scheduler: Scheduler, tracer: Tracer) -> Scheduler:
    """The scheduler with its single profile traced plugin by plugin; a handler that routes (prefill/decode, data
    parallelism) is traced by the director's span alone. Everything else (flow control, admitters) is kept."""
    if scheduler.routing is not None or len(scheduler.profiles) != 1:
        return scheduler
    traced = TracingScheduler(scheduler.profiles[0], tracer)
    return replace(scheduler, handler=traced, detailed=traced.pick_detailed)


class TracingScheduler:
    """A `ProfileScheduler` whose profile's plugins each get a span, inside one span for the profile's run."""

    def __init__(self, scheduler: ProfileScheduler, tracer: Tracer) -> None:
        profile = scheduler.profile
        traced = SchedulingProfile(
            name=profile.name,
            filters=tuple(_TracedFilter(f, tracer, "filter") for f in profile.filters),
            scorers=tuple(WeightedScorer(_TracedScorer(s.scorer, tracer), s.weight) for s in profile.scorers),
            picker=_TracedPicker(profile.picker, tracer, "picker"),
            observers=profile.observers,
            producers=profile.producers,  # run untraced, as before the filters: the scorers read what they publish
        )
        self._inner = ProfileScheduler(traced, scheduler.saturation)
        self.profile = profile
        self.saturation = scheduler.saturation
        self._tracer = tracer
        self._attributes = {"epp.profile": profile.describe()}

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float) -> Sequence[int]:
        with self._tracer.start_as_current_span("epp.scheduling", attributes=self._attributes) as span:
            span.set_attribute("epp.candidates", int(candidates.size))
            return self._inner.pick(snapshot, candidates, request, now)

    def pick_detailed(
        self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float
    ) -> tuple[Sequence[int], PickDetail]:
        """`pick` with its PickDetail (--emit-endpoint-scores, `Prefer: if-available`), in the same span."""
        with self._tracer.start_as_current_span("epp.scheduling", attributes=self._attributes) as span:
            span.set_attribute("epp.candidates", int(candidates.size))
            return self._inner.pick_detailed(snapshot, candidates, request, now)
