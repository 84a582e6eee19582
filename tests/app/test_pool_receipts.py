"""Route receipts and degradation alarms with several pools, wired as `epp serve` wires them (`pools_processor`, one
director per pool): with `--emit-route-receipts` each pool's streams carry receipts of that pool's endpoints in
`envoy.lb`, and each pool's watch raises its own alarms, labelled with the pool, in /metrics, /debug/pool and the
WARN line. Through a real grpc.aio server on loopback, the pool named in the stream's metadata as Envoy's route
sets it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp import wire
from epp.app.pool_path import pools_processor
from epp.app.pools import StaticPools
from epp.app.receipt_metrics import ReceiptMetrics
from epp.app.settings import ServeSettings
from epp.datastore import EndpointInfo, EndpointTable
from epp.datastore.pool import PoolSpec
from epp.director.director import WATCH_EVERY
from epp.extproc.server import add_to_server
from epp.observability.metrics import PickerMetrics
from epp.observability.plugins import PluginTimer
from epp.scheduling.degradation import WINDOW
from tests.extproc.envoy import body_msg, destination, headers_msg

POOLS = {"default/pool-a": ["127.32.1.1:8000", "127.32.1.2:8000"], "default/pool-b": ["127.32.2.1:8000"]}
# Every endpoint unscraped: each pool's metrics-data-source sees every candidate missing, a window of picks later.
PICKS = WATCH_EVERY * WINDOW + 8
BATCH = 25  # streams per pool at a time (one at a time, each waits out a delayed ACK)


def _body(i: int) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": f"question {i}"}]}).encode()


async def _messages(i: int) -> AsyncIterator[pb.ProcessingRequest]:
    yield headers_msg()
    yield body_msg(_body(i), True)


async def test_two_pools_streams_carry_their_pools_receipts_and_each_pools_alarms_carry_the_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    table = EndpointTable()
    table.replace_all([EndpointInfo(address=a, pool=key) for key, addresses in POOLS.items() for a in addresses])
    table.synced = True
    pools = StaticPools([PoolSpec(name=key.split("/")[1], selector={"app": key}) for key in POOLS])
    registry = CollectorRegistry()
    metrics = PickerMetrics(registry)
    receipts = ReceiptMetrics()
    registry.register(receipts)
    settings = ServeSettings(emit_receipts=True)
    processor = pools_processor(settings, None, pools, table, registry, PluginTimer(), None, metrics, receipts=receipts)
    server = grpc.aio.server()
    add_to_server(processor, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    chosen: dict[str, set[str]] = {key: set() for key in POOLS}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)

            async def one(i: int, key: str) -> None:
                call = stub.Process(_messages(i), metadata=((wire.POOL_METADATA, key),))
                answers: list[pb.ProcessingResponse] = [a async for a in call]
                head = next((a for a in answers if a.WhichOneof("response") == "request_headers"), None)
                assert head is not None, answers
                lb = head.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
                receipt = json.loads(lb[wire.ROUTE_RECEIPT_KEY].string_value)
                assert receipt["chosen"] == destination(head) and receipt["chosen"] in POOLS[key]
                chosen[key].add(receipt["chosen"])

            with caplog.at_level(logging.INFO, logger="epp.receipts"):
                for start in range(0, PICKS, BATCH):  # bounded: PICKS streams per pool, BATCH at a time
                    batch = range(start, min(PICKS, start + BATCH))
                    await asyncio.gather(*(one(i, key) for i in batch for key in POOLS))
    finally:
        await server.stop(0)
    assert chosen == {key: set(addresses) for key, addresses in POOLS.items()}
    assert len(receipts.watches) == 2 and {w.pool for w in receipts.watches} == set(POOLS)
    degraded = {
        (s.labels["pool"], s.labels["plugin"], s.labels["reason"]): s.value
        for f in registry.collect()
        if f.name == "llm_d_epp_degraded"
        for s in f.samples
    }
    for key in POOLS:
        assert degraded[(key, "metrics-data-source", "missing_signal")] == 1.0
        assert degraded[(key, "metrics-data-source", "stale_signal")] == 0.0
    episodes = {(e["pool"], e["plugin"], e["reason"]) for e in receipts.active(0.0)}
    assert {(key, "metrics-data-source", "missing_signal") for key in POOLS} <= episodes
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key in POOLS:
        assert any(f"degraded: pool {key}: metrics-data-source missing_signal" in line for line in warnings)
    assert receipts.snapshot()[0] == 2 * PICKS  # every pick's receipt aggregated, both pools'
