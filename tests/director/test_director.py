"""The director's priority, shedding and model-rewrite steps, driving the real default scheduler."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore, RewriteRule, RewriteTarget
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director import Director
from epp.errors import EppError, ErrorCode
from epp.extproc.messages import immediate_response
from epp.requests import parse_request
from epp.scheduling import build_scheduler

NOW = 50.0


def _table(waiting: float) -> EndpointTable:
    table = EndpointTable()
    for i in range(2):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, kv_usage=0.1), now=NOW)
    return table


def _request(model: str = "base", **headers: str):
    body = json.dumps({"model": model, "prompt": "hello there", "max_tokens": 3}).encode()
    return parse_request("r1", "/v1/completions", headers, body)


def _director(table: EndpointTable, store: ObjectiveStore, seed: int = 0) -> Director:
    return Director(table, build_scheduler(None, seed=seed), clock=lambda: NOW, objectives=store, seed=seed)


SHEDDING = [
    pytest.param(-1, 10.0, ErrorCode.RESOURCE_EXHAUSTED, id="sheddable-saturated-429"),
    pytest.param(-1, 0.0, None, id="sheddable-idle-served"),
    pytest.param(0, 10.0, None, id="default-priority-saturated-served"),
    pytest.param(5, 10.0, None, id="critical-saturated-served"),
]


@pytest.mark.parametrize(("priority", "waiting", "refused"), SHEDDING)
def test_shedding_by_priority_and_saturation(priority, waiting, refused) -> None:
    store = ObjectiveStore()
    store.put_objective("batch", priority)
    director = _director(_table(waiting), store)
    request = _request(**{"x-gateway-inference-objective": "batch"})
    if refused is None:
        assert director.decide(request).addresses
        return
    with pytest.raises(EppError) as err:
        director.decide(request)
    assert err.value.code is refused and err.value.code.http_status == 429
    assert "batch" in err.value.body


def test_unknown_objective_is_priority_zero_and_never_shed() -> None:
    director = _director(_table(10.0), ObjectiveStore())
    assert director.decide(_request(**{"x-gateway-inference-objective": "nobody"})).addresses


def test_header_rewrite_changes_body_model_and_keeps_the_original() -> None:
    director = _director(_table(0.0), ObjectiveStore())
    decision = director.decide(_request("base", **{"x-gateway-model-name-rewrite": "base-v2"}))
    assert decision.original_model == "base"
    assert decision.target_model == "base-v2"
    assert decision.body is not None
    body = json.loads(decision.body)
    assert body == {"model": "base-v2", "prompt": "hello there", "max_tokens": 3}


def test_a_rewrite_rule_wins_over_the_rewrite_header_as_upstream() -> None:
    """Upstream sets the target from the header, then a rule for the client's model overrides it."""
    store = ObjectiveStore()
    store.put_rewrite("default/pin", (RewriteRule("base", (RewriteTarget("base-rule"),)),))
    director = _director(_table(0.0), store)
    header = {"x-llm-d-model-name-rewrite": "base-header"}
    decision = director.decide(_request("base", **header))
    assert (decision.original_model, decision.target_model) == ("base", "base-rule")
    assert json.loads(decision.body)["model"] == "base-rule"
    # a model no rule covers: the header applies (and a rule for the header's model is not chained)
    store.put_rewrite("default/chain", (RewriteRule("base-header", (RewriteTarget("chained"),)),))
    assert director.decide(_request("other", **header)).target_model == "base-header"


def test_rewrite_rules_pick_weighted_targets_reproducibly() -> None:
    store = ObjectiveStore()
    rule = RewriteRule("base", (RewriteTarget("canary", 1), RewriteTarget("stable", 3)))
    store.put_rewrite("default/split", (rule,))
    director = _director(_table(0.0), store, seed=4)
    targets = [director.decide(_request("base")).target_model for _ in range(2000)]
    share = targets.count("stable") / len(targets)
    assert 0.7 < share < 0.8
    again = _director(_table(0.0), store, seed=4)
    assert [again.decide(_request("base")).target_model for _ in range(50)] == targets[:50]


def test_no_rewrite_means_no_new_body() -> None:
    store = ObjectiveStore()
    store.put_rewrite("default/other", (RewriteRule("other", (RewriteTarget("x"),)),))
    decision = _director(_table(0.0), store).decide(_request("base"))
    assert decision.body is None
    assert decision.original_model == decision.target_model == "base"


def test_decisions_book_the_pick_in_flight_and_complete_releases_it() -> None:
    table = _table(0.0)
    director = _director(table, ObjectiveStore())
    decision = director.decide(_request())
    assert table.snapshot().inflight[decision.slot] == 1
    director.complete(decision)
    assert table.snapshot().inflight[decision.slot] == 0


@settings(max_examples=40, deadline=None)
@given(subset=st.sets(st.integers(0, 7), min_size=1), prompt=st.text(max_size=200))
def test_a_decision_stays_inside_the_gateway_subset_hint(subset, prompt) -> None:
    table = EndpointTable()
    for i in range(8):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000"))
        table.record_scrape(slot, MetricsSample(waiting=float(i % 3), kv_usage=0.1 * i), now=NOW)
    director = _director(table, ObjectiveStore())
    hint = [f"127.10.0.{i + 1}:8000" for i in subset]
    body = json.dumps({"model": "m", "prompt": prompt or "x"}).encode()
    decision = director.decide(parse_request("r", "/v1/completions", {}, body), hint)
    assert set(decision.addresses) <= set(hint)


def test_with_the_subset_filter_disabled_the_hint_is_ignored() -> None:
    table = _table(waiting=0.0)
    director = Director(table, build_scheduler(None, seed=0), clock=lambda: NOW, honour_subset=False)
    decision = director.decide(_request(), ["127.10.0.99:8000"])  # a hint naming no pool endpoint
    assert decision.addresses[0] in {"127.10.0.1:8000", "127.10.0.2:8000"}


def test_a_sheddable_request_named_by_upstreams_header_gets_429_with_the_dropped_reason() -> None:
    store = ObjectiveStore()
    store.put_objective("batch", -1)
    director = _director(_table(10.0), store)
    with pytest.raises(EppError) as err:
        director.decide(_request(**{"x-llm-d-inference-objective": "batch"}))
    assert err.value.code.http_status == 429 and err.value.dropped_reason == "rejected-saturated"
    answer = immediate_response(err.value).immediate_response
    assert answer.status.code == 429
    headers = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"


def test_an_empty_pool_is_refused_with_rejected_no_endpoints_and_a_scheduler_failure_without_a_reason() -> None:
    director = _director(EndpointTable(), ObjectiveStore())
    with pytest.raises(EppError) as err:
        director.decide(_request())
    assert err.value.code.http_status == 503 and err.value.dropped_reason == "rejected-no-endpoints"
    headers = immediate_response(EppError(ErrorCode.SERVICE_UNAVAILABLE, "x")).immediate_response.headers
    assert [h.header.key for h in headers.set_headers] == ["content-type"]


def test_the_conformance_selection_header_is_honoured_only_when_enabled() -> None:
    table = _table(waiting=0.0)
    named = _request(**{"test-epp-endpoint-selection": "127.10.0.2"})
    enabled = Director(table, build_scheduler(None, seed=0), clock=lambda: NOW, test_selection=True)
    assert {enabled.decide(named).addresses[0] for _ in range(20)} == {"127.10.0.2:8000"}
    with pytest.raises(EppError) as err:
        enabled.decide(_request(**{"test-epp-endpoint-selection": "127.10.0.77"}))
    assert "test-epp-endpoint-selection" in err.value.message
    disabled = Director(table, build_scheduler(None, seed=0), clock=lambda: NOW)
    assert len({disabled.decide(named).addresses[0] for _ in range(40)}) == 2


def test_a_decision_books_its_prefill_until_the_first_byte_and_complete_does_not_release_it_twice() -> None:
    table = _table(0.0)
    director = _director(table, ObjectiveStore())
    first, second = director.decide(_request()), director.decide(_request())
    held = table.snapshot().prefill_tokens
    assert first.prefill == first.tokens > 0  # no prefill scorer noted a cached prefix: every prompt token
    assert held.sum() == first.prefill + second.prefill
    director.first_byte(first)
    director.first_byte(first)  # once per decision
    assert table.snapshot().prefill_tokens.sum() == second.prefill
    director.complete(first)
    assert table.snapshot().prefill_tokens.sum() == second.prefill
    director.complete(second)  # no first byte came: released at the end
    assert table.snapshot().prefill_tokens.sum() == 0
    assert table.snapshot().inflight.sum() == 0


def test_with_the_prefill_queue_scorer_a_decision_books_only_the_tokens_not_cached_where_it_goes() -> None:
    from epp.config.decode import parse_config

    config = parse_config(
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                {"type": "approx-prefix-cache-producer"},
                {
                    "type": "prefix-cache-scorer",
                    "parameters": {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"},
                },
                {"type": "prefill-queue-scorer"},
                {"type": "max-score-picker"},
            ],
            "schedulingProfiles": [
                {
                    "name": "default",
                    "plugins": [
                        {"pluginRef": "prefix-cache-scorer", "weight": 1},
                        {"pluginRef": "prefill-queue-scorer", "weight": 1},
                        {"pluginRef": "max-score-picker"},
                    ],
                }
            ],
        }
    )
    table = _table(0.0)
    director = Director(table, build_scheduler(config, seed=0), clock=lambda: NOW, seed=0)
    body = json.dumps({"model": "base", "prompt": "a long shared context " * 200, "max_tokens": 3}).encode()
    cold = director.decide(parse_request("r1", "/v1/completions", {}, body))
    warm = director.decide(parse_request("r2", "/v1/completions", {}, body))
    assert cold.prefill == cold.tokens
    assert warm.slot == cold.slot and 0 <= warm.prefill < warm.tokens  # the prefix is cached there
    assert table.snapshot().prefill_tokens[cold.slot] == cold.prefill + warm.prefill
