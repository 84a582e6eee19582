"""One picker for several pools: each pool's director picks only its pool's endpoints, and the router gives a
stream the pipeline its gRPC metadata names, or the pool-less failure mode's answer (never another pool's
endpoint). Through a real grpc.aio server on loopback, as Envoy's per-route metadata reaches it."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp import wire
from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Director
from epp.director.pools import PoolLessMode, PoolRoute, PoolRouter
from epp.errors import EppError, ErrorCode
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.observability.pools import PoolRequestCollector
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler
from tests.extproc.envoy import BODY, body_msg, destination, headers_msg, immediate
from tests.support.schedulers import RandomScheduler

POOLS = {f"default/pool-{n}": [f"127.30.{i}.{j}:8000" for j in range(1, 9)] for i, n in enumerate("abc", 1)}


def table_of(pools: dict[str, list[str]]) -> EndpointTable:
    table = EndpointTable()
    infos = [EndpointInfo(address=a, pool=key) for key, addresses in pools.items() for a in addresses]
    random.Random(7).shuffle(infos)  # slots interleaved across pools
    table.replace_all(infos)
    table.synced = True
    return table


def directors(table: EndpointTable) -> dict[str, Director]:
    return {key: Director(table, Scheduler(RandomScheduler(seed=1)), clock=lambda: 0.0, pool=key) for key in POOLS}


def request() -> InferenceRequest:
    return InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="m1", prompt="hello")


def test_each_pools_director_picks_only_its_pools_endpoints() -> None:
    table = table_of(POOLS)
    by_pool = directors(table)
    picks: Counter[str] = Counter()
    for i in range(3000):
        key = list(POOLS)[i % 3]
        decision = by_pool[key].decide(request())
        assert decision.addresses[0] in POOLS[key]
        picks[decision.addresses[0]] += 1
        by_pool[key].complete(decision)
    assert len(picks) == 24  # every endpoint of every pool served


def test_a_pool_with_no_endpoints_answers_by_itself_while_the_others_serve() -> None:
    table = table_of(POOLS)
    by_pool = directors(table)
    for address in POOLS["default/pool-b"]:
        table.remove(address)
    with pytest.raises(EppError) as refused:
        by_pool["default/pool-b"].decide(request())
    assert refused.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert refused.value.dropped_reason == wire.REJECTED_NO_ENDPOINTS
    assert by_pool["default/pool-a"].decide(request()).addresses[0] in POOLS["default/pool-a"]


def test_the_subset_hint_is_narrowed_to_the_pool() -> None:
    table = table_of(POOLS)
    director = directors(table)["default/pool-a"]
    other = POOLS["default/pool-b"][0]
    with pytest.raises(EppError):
        director.decide(request(), [other])  # an endpoint of another pool is never a candidate
    assert director.decide(request(), [other, POOLS["default/pool-a"][3]]).addresses == (POOLS["default/pool-a"][3],)


def _router(mode: PoolLessMode = PoolLessMode.FAIL_CLOSE) -> tuple[PoolRouter, dict[str, Director], PickerMetrics]:
    table = table_of(POOLS)
    by_pool = directors(table)
    metrics = PickerMetrics(CollectorRegistry())
    observers = PoolRequestCollector(metrics)
    metrics.registry.register(observers)
    routes = {key: PoolRoute(d.pipeline, observers.observer(key)) for key, d in by_pool.items()}
    return PoolRouter(routes.get, "default", mode, metrics, lambda: 0.0), by_pool, metrics


def test_the_router_reads_the_pool_from_the_streams_metadata() -> None:
    router, by_pool, _ = _router()
    assert router.route([(wire.POOL_METADATA, "default/pool-b")]).pipeline is by_pool["default/pool-b"].pipeline
    assert (
        router.route([("other", "x"), (wire.POOL_METADATA, b"pool-c")]).pipeline is by_pool["default/pool-c"].pipeline
    )


@pytest.mark.parametrize(
    ("mode", "status"),
    [(PoolLessMode.FAIL_CLOSE, ErrorCode.SERVICE_UNAVAILABLE), (PoolLessMode.REJECT, ErrorCode.BAD_REQUEST)],
)
@pytest.mark.parametrize("metadata", [[], [(wire.POOL_METADATA, "default/pool-z")], [(wire.POOL_METADATA, " ")]])
def test_a_stream_whose_pool_cannot_be_told_gets_the_pool_less_answer(mode, status, metadata) -> None:
    router, _, _ = _router(mode)
    route = router.route(metadata)
    assert route.pipeline.immediate is not None
    with pytest.raises(EppError) as refused:
        route.pipeline.immediate(request(), None)
    assert refused.value.code is status
    assert refused.value.dropped_reason == wire.REJECTED_UNKNOWN_POOL


async def _one_request(port: int, metadata: tuple[tuple[str, str], ...]) -> list[pb.ProcessingResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process(
            iter([headers_msg(), body_msg(BODY, True)]), metadata=metadata
        )
        return [response async for response in call]


async def test_streams_through_grpc_reach_the_pool_their_metadata_names_and_are_counted_per_pool() -> None:
    router, _, metrics = _router()
    processor = ExternalProcessor(router.pool_less, metrics, StreamSettings(), pools=router)
    server = grpc.aio.server()
    add_to_server(processor, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        for key, addresses in POOLS.items():
            for _ in range(5):
                answers = await _one_request(port, ((wire.POOL_METADATA, key),))
                headers = [a for a in answers if a.WhichOneof("response") == "request_headers"]
                assert destination(headers[0]) in addresses
        status, body = immediate(await _one_request(port, ()))
        assert status == 503 and "named no InferencePool" in body
    finally:
        await server.stop(0)
    sample = metrics.registry.get_sample_value
    for key in POOLS:
        assert sample("llm_d_epp_pool_requests_total", {"pool": key, "code": "OK"}) == 5
        assert sample("llm_d_epp_pool_decisions_total", {"pool": key}) == 5
