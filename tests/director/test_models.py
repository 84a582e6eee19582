"""`GET /v1/models` answered by the picker (--serve-models-list): the names a client may send to a pool
(objectives, rewrites, LoRA adapters its endpoints report), one pool's or the union of all; through the pipeline's
answer stage and the pool-less route, without touching an endpoint."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from epp import wire
from epp.datastore import EndpointInfo, EndpointTable
from epp.datastore.objectives import ObjectiveStore, RewriteRule, RewriteTarget
from epp.director import Director
from epp.director.decision import Answer, Decision
from epp.director.models import ModelsList, is_models_request
from epp.director.pools import PoolLessMode, PoolRoute, PoolRouter
from epp.errors import EppError
from epp.observability.metrics import PickerMetrics
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler
from tests.support.schedulers import RandomScheduler

A, B = "default/pool-a", "default/pool-b"


def _table() -> EndpointTable:
    table = EndpointTable()
    table.replace_all(
        [
            EndpointInfo(address="127.31.1.1:8000", pool=A),
            EndpointInfo(address="127.31.1.2:8000", pool=A),
            EndpointInfo(address="127.31.2.1:8000", pool=B),
        ]
    )
    table.synced = True
    slot_a, slot_b = table.slot_of("127.31.1.2:8000"), table.slot_of("127.31.2.1:8000")
    assert slot_a is not None and slot_b is not None
    table.set_adapters(slot_a, ["sql-lora"], ["chat-lora"])
    table.set_adapters(slot_b, ["b-lora"], [])
    return table


def _stores() -> dict[str, ObjectiveStore]:
    a, b = ObjectiveStore(), ObjectiveStore()
    a.replace_objectives({"critical": 10})
    a.replace_rewrites({"default/r": (RewriteRule("food-review", (RewriteTarget("llama-3"),)),)})
    b.replace_objectives({"batch": 0, "critical": 5})
    return {A: a, B: b}


def _get(path: str = "/v1/models", method: str = "GET") -> InferenceRequest:
    headers = {":method": method, ":path": path}
    return InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="", headers=headers, no_body=True)


def _listed(answer: Answer | None) -> dict[str, str]:
    assert answer is not None and answer.content_type == "application/json"
    body = json.loads(answer.body)
    assert body["object"] == "list"
    assert all(item["object"] == "model" and isinstance(item["created"], int) for item in body["data"])
    return {item["id"]: item["owned_by"] for item in body["data"]}


def test_one_pool_lists_its_objectives_rewrites_and_its_endpoints_adapters() -> None:
    table, stores = _table(), _stores()
    models = ModelsList(table, lambda: [(A, stores[A], True)])
    assert _listed(models.answer(_get())) == {
        "critical": A,
        "food-review": A,
        "llama-3": A,
        "sql-lora": A,
        "chat-lora": A,
    }  # pool-b's adapter and objective are not pool-a's


def test_the_aggregate_is_the_union_each_name_owned_by_the_first_pool_that_has_it() -> None:
    table, stores = _table(), _stores()
    union = ModelsList(table, lambda: [(key, stores[key], True) for key in (A, B)])
    listed = _listed(union.answer(_get()))
    assert listed == {
        "critical": A,
        "food-review": A,
        "llama-3": A,
        "sql-lora": A,
        "chat-lora": A,
        "batch": B,
        "b-lora": B,
    }


def test_the_list_follows_the_stores_at_run_time() -> None:
    table, stores = _table(), _stores()
    models = ModelsList(table, lambda: [(A, stores[A], True)])
    stores[A].put_objective("new-objective", 1)
    slot = table.slot_of("127.31.1.1:8000")
    assert slot is not None
    table.set_adapters(slot, ["late-lora"], [])
    assert {"new-objective", "late-lora"} <= set(_listed(models.answer(_get())))


def test_only_a_get_of_v1_models_is_answered() -> None:
    assert is_models_request(_get("/v1/models"))
    assert is_models_request(_get("/v1/models/?x=1"))
    assert not is_models_request(_get("/v1/models", "POST"))
    assert not is_models_request(_get("/v1/models/llama-3"))
    assert not is_models_request(_get("/v1/completions"))


def _director(table: EndpointTable, stores: dict[str, ObjectiveStore]) -> Director:
    return Director(table, Scheduler(RandomScheduler(seed=1)), clock=lambda: 0.0, objectives=stores[A], pool=A)


def test_the_pipelines_answer_stage_answers_without_a_pick_and_leaves_other_requests_to_the_director() -> None:
    table, stores = _table(), _stores()
    director = _director(table, stores)
    pipeline = director.pipeline.answering(ModelsList(table, lambda: [(A, stores[A], True)]).answer)
    assert pipeline.immediate is not None
    outcome = pipeline.immediate(_get(), None)
    assert outcome.__class__ is Answer and "sql-lora" in _listed(outcome)  # type: ignore[arg-type]
    assert int(table.snapshot().inflight.sum()) == 0  # nothing booked
    decided = pipeline.immediate(_get("/v1/completions"), None)  # another body-less request: picked as before
    assert decided.__class__ is Decision and decided.addresses[0].startswith("127.31.1.")  # type: ignore[union-attr]


async def test_the_pipelines_run_answers_before_any_stage() -> None:
    table, stores = _table(), _stores()
    pipeline = _director(table, stores).pipeline.answering(ModelsList(table, lambda: [(A, stores[A], True)]).answer)
    steps = [step async for step in pipeline.run(_get(), None)]
    assert len(steps) == 1 and steps[0].outcome.__class__ is Answer  # type: ignore[union-attr]


def test_a_stream_of_no_pool_gets_the_aggregate_list_and_the_pool_less_answer_for_anything_else() -> None:
    table, stores = _table(), _stores()
    union = ModelsList(table, lambda: [(key, stores[key], True) for key in (A, B)])
    metrics = PickerMetrics(CollectorRegistry())
    director = _director(table, stores)
    routes = {A: PoolRoute(director.pipeline, metrics)}
    router = PoolRouter(routes.get, "default", PoolLessMode.FAIL_CLOSE, metrics, lambda: 0.0, union.answer)
    pool_less = router.route([]).pipeline
    assert pool_less.immediate is not None
    assert "b-lora" in _listed(pool_less.immediate(_get(), None))  # type: ignore[arg-type]
    with pytest.raises(EppError) as refused:
        pool_less.immediate(_get("/v1/completions"), None)
    assert refused.value.dropped_reason == wire.REJECTED_UNKNOWN_POOL
    unknown = router.route([(wire.POOL_METADATA, "default/pool-z")]).pipeline  # a named pool not served: refused
    assert unknown.immediate is not None
    with pytest.raises(EppError):
        unknown.immediate(_get(), None)
