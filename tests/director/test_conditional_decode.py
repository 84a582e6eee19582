"""`Prefer: if-available` (conditional decode, RFC 7240): forwarded only to an endpoint that already holds part of
the prompt in its KV cache, else 412, as upstream's director gates it after the pick.

Upstream's facts (llm-d-router `pkg/common/routing`, `pkg/epp/requestcontrol/director.go`): the token is matched
bare, case-insensitively, among comma-separated preferences with `;` parameters; the gate reads the picked
endpoint's prefix-cache match and answers 412 `PreconditionFailed` "no decode worker has the requested KV cache"
when it has no block (or no prefix producer ran); no dropped-reason header.
"""

from __future__ import annotations

import json

import pytest

from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director import Director
from epp.errors import EppError, ErrorCode
from epp.extproc.messages import immediate_response
from epp.requests import parse_request
from epp.scheduling import build_scheduler
from epp.scheduling.scheduler import Scheduler
from epp.wire import DROPPED_REASON_HEADER, prefers_if_available
from tests.scheduling.tables import request as disagg_request
from tests.scheduling.tables import table_with
from tests.scheduling.test_disagg import ALWAYS, ROLES_2P2D, pd_config
from tests.support.schedulers import RandomScheduler

NOW = 50.0
PROMPT = "the same long system prompt, shared by every turn of the conversation. " * 40  # many whole blocks


def _table() -> EndpointTable:
    table = EndpointTable()
    for i in range(3):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=0, kv_usage=0.1), now=NOW)
    return table


def _request(prompt: str = PROMPT, **headers: str):
    body = json.dumps({"model": "base", "prompt": prompt, "max_tokens": 3}).encode()
    return parse_request("r1", "/v1/completions", headers, body)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("if-available", True),
        ("IF-Available", True),
        ("respond-async, if-available", True),
        (" if-available ; foo=bar", True),
        ("wait=10", False),
        ("if-available-later", False),
        ("", False),
    ],
)
def test_the_prefer_token_is_matched_as_rfc_7240_lists_it(value: str, expected: bool) -> None:
    assert prefers_if_available({"prefer": value}) is expected


def test_a_cold_prompt_gets_412_and_nothing_is_booked() -> None:
    table = _table()
    director = Director(table, build_scheduler(None, seed=1), clock=lambda: NOW)
    with pytest.raises(EppError) as err:
        director.decide(_request(prefer="if-available"))
    assert err.value.code is ErrorCode.PRECONDITION_FAILED and err.value.code.http_status == 412
    assert err.value.body == "inference error: PreconditionFailed - no decode worker has the requested KV cache"
    assert err.value.dropped_reason is None
    assert table.snapshot().inflight.sum() == 0
    answer = immediate_response(err.value).immediate_response
    assert answer.status.code == 412
    assert DROPPED_REASON_HEADER not in {h.header.key for h in answer.headers.set_headers}


def test_a_prompt_the_picked_endpoint_has_cached_is_forwarded_there() -> None:
    table = _table()
    director = Director(table, build_scheduler(None, seed=1), clock=lambda: NOW)
    first = director.decide(_request())  # no preference: served, and the prefix index learns where it went
    director.complete(first)
    again = director.decide(_request(prefer="if-available"))
    assert again.addresses == first.addresses
    with pytest.raises(EppError):  # another prompt: no endpoint holds it
        director.decide(_request("an unrelated prompt that nobody has seen before. " * 40, prefer="if-available"))


def test_without_a_prefix_producer_every_conditional_request_is_412() -> None:
    """Upstream: no prefix-cache match attribute on the endpoint (no scorer attached) means 412."""
    director = Director(_table(), Scheduler(RandomScheduler()), clock=lambda: NOW)
    assert director.decide(_request()).addresses
    with pytest.raises(EppError) as err:
        director.decide(_request(prefer="if-available"))
    assert err.value.code is ErrorCode.PRECONDITION_FAILED


def test_with_the_producer_and_p_d_the_decode_endpoint_is_what_counts() -> None:
    """Upstream's current profile shape (approx-prefix-cache-producer) under disagg-profile-handler: the gate reads
    the decode (primary) profile's pick."""
    table = table_with([{}] * 4, labels=ROLES_2P2D)
    director = Director(table, build_scheduler(pd_config(ALWAYS), seed=0), clock=lambda: NOW)
    with pytest.raises(EppError) as err:
        director.decide(disagg_request(PROMPT, headers={"prefer": "if-available"}))
    assert err.value.code is ErrorCode.PRECONDITION_FAILED
    first = director.decide(disagg_request(PROMPT))
    director.complete(first)
    again = director.decide(disagg_request(PROMPT, headers={"prefer": "if-available"}))
    assert again.addresses == first.addresses and again.slot in (2, 3)  # a decode endpoint
