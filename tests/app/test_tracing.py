"""`--tracing`: spans for the request, the decision, the scheduling profile and each plugin; W3C trace context
continued from the client and passed on to the model server."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from epp.app.tracing import TracingDirector, traced_scheduler
from epp.config.decode import parse_config
from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Director
from epp.errors import EppError, ErrorCode
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.requests import parse_request
from epp.scheduling import build_scheduler
from tests.extproc.envoy import BODY, POOL, DecidingStream, body_msg, destination, headers_msg, immediate

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def traced() -> tuple[DecidingStream, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in POOL)
    table.synced = True
    scheduler = traced_scheduler(build_scheduler(None, seed=1), tracer)
    director = TracingDirector(Director(table, scheduler, clock=lambda: 0.0), tracer)  # type: ignore[arg-type]
    metrics = PickerMetrics(CollectorRegistry())
    return DecidingStream(director, metrics, lambda: 0.0, StreamSettings()), exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def set_headers(response: object) -> dict[str, str]:
    common = getattr(response, response.WhichOneof("response")).response  # type: ignore[attr-defined]
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def test_spans_continue_the_clients_trace_and_the_gateway_passes_it_on(traced) -> None:
    stream, exporter = traced
    stream.handle(headers_msg(extra={"traceparent": TRACEPARENT}))
    out = stream.handle(body_msg(BODY, True))
    assert destination(out[0]) in POOL
    assert not [s for s in exporter.get_finished_spans() if s.name == "epp.request"]  # open until the stream ends
    stream.close()
    spans = by_name(exporter.get_finished_spans())
    request = spans["epp.request"][0]
    assert f"{request.context.trace_id:032x}" == TRACE_ID  # continued, not a new trace
    assert request.parent is not None and f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.attributes["gen_ai.request.model"] == "m1"
    assert request.attributes["epp.endpoint"] == destination(out[0])
    decision = spans["epp.decision"][0]
    assert decision.parent.span_id == request.context.span_id
    scheduling = spans["epp.scheduling"][0]
    assert scheduling.parent.span_id == decision.context.span_id
    plugins = [s for s in exporter.get_finished_spans() if s.name.startswith("epp.plugin.")]
    assert plugins and all(s.parent.span_id == scheduling.context.span_id for s in plugins)
    assert {s.name for s in plugins} >= {"epp.plugin.scorer", "epp.plugin.picker"}
    # what the gateway forwards: a traceparent naming the picker's request span, in the same trace
    forwarded = set_headers(out[0])["traceparent"]
    assert forwarded == f"00-{TRACE_ID}-{request.context.span_id:016x}-01"


def test_a_request_without_trace_context_starts_a_trace(traced) -> None:
    stream, exporter = traced
    stream.handle(headers_msg())
    out = stream.handle(body_msg(BODY, True))
    stream.close()
    request = by_name(exporter.get_finished_spans())["epp.request"][0]
    assert request.parent is None
    assert set_headers(out[0])["traceparent"].split("-")[1] == f"{request.context.trace_id:032x}"


def test_a_refused_request_ends_its_span_with_the_reason(traced) -> None:
    stream, exporter = traced
    stream.handle(headers_msg(extra={"traceparent": TRACEPARENT}))
    status, _ = immediate(stream.handle(body_msg(json.dumps({"model": "m1"}).encode(), True)))
    assert status == 400
    spans = by_name(exporter.get_finished_spans())
    assert "epp.request" not in spans  # a refusal at parsing comes before the director: nothing to trace yet


def test_a_refusal_by_the_director_is_an_error_span(traced) -> None:
    stream, exporter = traced
    stream._bookings._director._table.replace_all([])  # no endpoint: 503  # type: ignore[attr-defined]
    stream.handle(headers_msg(extra={"traceparent": TRACEPARENT}))
    status, _ = immediate(stream.handle(body_msg(BODY, True)))
    assert status == 503
    request = by_name(exporter.get_finished_spans())["epp.request"][0]
    assert request.status.status_code is StatusCode.ERROR
    assert request.attributes["http.response.status_code"] == 503


def test_the_exporter_and_service_name_come_from_the_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from epp.app.build import build_tracing
    from epp.app.tracing import provider_from_env

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "picker-a")
    provider = provider_from_env()
    assert provider.resource.attributes["service.name"] == "picker-a"
    assert build_tracing(False) == (None, None)  # off unless asked for
    provider, tracer = build_tracing(True)
    assert provider is not None and tracer is not None
    assert "epp.worker" not in provider.resource.attributes
    provider.shutdown()


def test_a_serving_workers_spans_name_the_worker_beside_the_same_service(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from epp.app.build import build_tracing

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    provider, _ = build_tracing(True, worker=1)
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "epp" and attributes["deployment.environment"] == "test"
    assert attributes["epp.worker"] == 1 and attributes["process.pid"] == os.getpid()
    provider.shutdown()


def test_the_traced_scheduler_keeps_the_producers_flow_control_and_admitters() -> None:
    """Tracing wraps the plugins only: the config's producers still run, flow control and admission stay on."""
    doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "prefix-cache-scorer"},
            {"type": "probabilistic-admitter"},
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "prefix-cache-scorer"}]}],
    }
    scheduler = build_scheduler(parse_config(doc, "traced.yaml"), seed=1)
    tracer = TracerProvider().get_tracer("test")
    traced = traced_scheduler(scheduler, tracer)
    assert traced.handler is not scheduler.handler
    assert traced.flow is scheduler.flow is not None and traced.admitters == scheduler.admitters != ()
    producers = scheduler.handler.profile.producers  # the file's, and the token-producer it consumes (auto-created)
    assert [p.type_name for p in producers] == ["token-producer", "approx-prefix-cache-producer"]
    assert traced.handler._inner.profile.producers == producers


def test_a_traced_scheduler_still_gives_scores_and_the_conditional_decode_answer() -> None:
    """The traced handler offers the pick's detail too: --emit-endpoint-scores and `Prefer: if-available` work."""
    tracer = TracerProvider().get_tracer("test")
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in POOL)
    table.synced = True
    director = Director(
        table, traced_scheduler(build_scheduler(None, seed=1), tracer), clock=lambda: 0.0, emit_scores=True
    )
    prompt = "a long prompt the prefix scorer splits into many whole blocks. " * 40
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    decision = director.decide(parse_request("r", "/v1/completions", {}, body))
    assert {a for a, _ in decision.scores} == set(POOL)
    director.complete(decision)
    again = director.decide(parse_request("r", "/v1/completions", {"prefer": "if-available"}, body))
    assert again.addresses == decision.addresses
    with pytest.raises(EppError) as err:
        director.decide(
            parse_request("r", "/v1/completions", {"prefer": "if-available"}, b'{"model":"m","prompt":"x"}')
        )
    assert err.value.code is ErrorCode.PRECONDITION_FAILED


def test_the_otlp_exporter_imports_beside_the_envoy_stubs(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    """xds-protos ships an older copy of opentelemetry/proto; installed over opentelemetry-proto's, the OTLP exporter
    fails to import and `--tracing` exports nothing. The install (Makefile) puts opentelemetry-proto's files back."""
    import logging

    from epp.app.tracing import provider_from_env

    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)  # otlp, the default
    with caplog.at_level(logging.WARNING, logger="epp.app.tracing"):
        provider = provider_from_env()
    provider.shutdown()
    assert "not installed" not in caplog.text
