"""Through the stream: `--emit-endpoint-scores` reaches the answer's `envoy.lb` metadata, and a cold
`Prefer: if-available` request is answered 412 (the Director's own tests cover the rules)."""

from __future__ import annotations

from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Director
from epp.scheduling import build_scheduler
from epp.wire import DESTINATION_HEADER, DESTINATION_SCORES_KEY, LB_NAMESPACE
from tests.extproc.envoy import BODY, POOL, body_msg, headers_msg, immediate, make_stream


def _director(emit_scores: bool) -> Director:
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in POOL)
    table.synced = True
    return Director(table, build_scheduler(None, seed=1), clock=lambda: 0.0, emit_scores=emit_scores)


def test_the_answer_carries_every_scored_endpoint_in_envoy_lb_metadata() -> None:
    stream, _, _ = make_stream(_director(emit_scores=True))
    stream.handle(headers_msg())
    out = stream.handle(body_msg(BODY, True))
    lb = out[0].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    scores = lb[DESTINATION_SCORES_KEY].struct_value.fields
    assert set(scores) == set(POOL) and lb[DESTINATION_HEADER].string_value in POOL


def test_without_the_flag_no_scores_are_written() -> None:
    stream, _, _ = make_stream(_director(emit_scores=False))
    stream.handle(headers_msg())
    out = stream.handle(body_msg(BODY, True))
    assert DESTINATION_SCORES_KEY not in out[0].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields


def test_a_conditional_decode_request_with_no_cached_prefix_is_412() -> None:
    stream, director, _ = make_stream(_director(emit_scores=False))
    stream.handle(headers_msg(extra={"prefer": "if-available"}))
    status, body = immediate(stream.handle(body_msg(BODY, True)))
    assert (status, body) == (412, "inference error: PreconditionFailed - no decode worker has the requested KV cache")
    assert int(director.table.snapshot().inflight.sum()) == 0
