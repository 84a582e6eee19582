"""`--emit-endpoint-scores`: every endpoint the primary profile scored, with its weighted score, in the `envoy.lb`
dynamic metadata under `x-gateway-destination-endpoint-scores`; off by default.

Upstream's facts (llm-d-router `pkg/epp/handlers/request.go` generateMetadata, `pkg/epp/scheduling/
scheduler_profile.go`): a struct ip:port → number beside `x-gateway-destination-endpoint` in `envoy.lb`; the scores
are the profile's weighted sums over every candidate its filters kept, not only the picked one; metadata only.
"""

from __future__ import annotations

import json

import pytest

from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director import Director
from epp.extproc.messages import DecisionAnswers
from epp.requests import parse_request
from epp.scheduling import build_scheduler
from epp.wire import DESTINATION_HEADER, DESTINATION_SCORES_KEY, LB_NAMESPACE

NOW = 50.0


def _table() -> EndpointTable:
    table = EndpointTable()
    for i, waiting in enumerate((0, 4, 8)):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, kv_usage=0.1), now=NOW)
    return table


def _request():
    body = json.dumps({"model": "base", "prompt": "hello there", "max_tokens": 3}).encode()
    return parse_request("r1", "/v1/completions", {}, body)


def test_scores_are_off_by_default() -> None:
    director = Director(_table(), build_scheduler(None, seed=1), clock=lambda: NOW)
    assert director.decide(_request()).scores == ()


def test_every_endpoint_the_filters_kept_gets_its_weighted_score_and_the_pick_scores_highest() -> None:
    director = Director(_table(), build_scheduler(None, seed=1), clock=lambda: NOW, emit_scores=True)
    decision = director.decide(_request())
    scores = dict(decision.scores)
    # the default profile's utilization-detector filter drops the endpoint with 8 waiting: it is not scored
    assert set(scores) == {"127.10.0.1:8000", "127.10.0.2:8000"}
    assert max(scores, key=scores.__getitem__) == decision.addresses[0] == "127.10.0.1:8000"
    assert scores["127.10.0.1:8000"] > scores["127.10.0.2:8000"] >= 0


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_the_scores_go_into_envoy_lb_metadata_beside_the_destination(phase: str) -> None:
    answers = DecisionAnswers()
    scores = (("127.10.0.1:8000", 6.5), ("127.10.0.2:8000", 2.0))
    destination = "127.10.0.1:8000"
    response = answers.decision(phase, ((DESTINATION_HEADER, destination),), destination, scores=scores)
    lb = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    assert lb[DESTINATION_HEADER].string_value == destination
    emitted = {k: v.number_value for k, v in lb[DESTINATION_SCORES_KEY].struct_value.fields.items()}
    assert emitted == dict(scores)
    headers = response.request_headers if phase == "headers" else response.request_body
    keys = {h.header.key for h in headers.response.header_mutation.set_headers}
    assert DESTINATION_SCORES_KEY not in keys  # metadata only, as upstream
    # a request's own scores are never handed out again to another request
    again = answers.decision(phase, ((DESTINATION_HEADER, destination),), destination, scores=(("x", 1.0),))
    assert again is not response
    plain = answers.decision(phase, ((DESTINATION_HEADER, destination),), destination)
    assert DESTINATION_SCORES_KEY not in plain.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
