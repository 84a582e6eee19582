"""Flow control across serving workers: the control process's one gate (`FlowHost` over a `FlowGate`) and two
workers' `RemoteFlowGate`s, the kit's pipe played by the event loop (each message delivered on a later turn).
The pool holds one request (concurrency-detector, maxConcurrency 1), its in-flight count summed from a
worker × endpoint matrix as `epp.app.workers` sums it."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import numpy as np
import pytest

from epp.app.flow_host import FlowHost
from epp.config.flowcontrol import FlowControlSpec
from epp.datastore import EndpointTable, Freshness
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director.flow import FlowGate
from epp.director.flow_link import RemoteFlowGate
from epp.errors import EppError
from epp.flowcontrol import FlowController, FlowSettings
from epp.flowcontrol.eviction import Reclaimer
from epp.flowcontrol.gauge import PoolGauge
from epp.scheduling.saturation import ConcurrencyDetector

OBJECTIVE = "x-llm-d-inference-objective"


class Picker:
    """The control process's gate and two workers' links, over a pipe that delivers on the loop's next turn."""

    def __init__(self, ttl_s: float = 30.0, eviction: bool = False, workers: int = 2) -> None:
        self.loop = asyncio.get_running_loop()
        self.table = EndpointTable()
        slot = self.table.upsert(EndpointInfo(address="127.10.0.1:8000", labels={}, pod_name="p0"))
        self.table.record_scrape(slot, MetricsSample(waiting=0, kv_usage=0.0), now=self.loop.time())
        self.matrix = np.zeros((workers, 1, 3), dtype=np.int64)
        self.objectives = ObjectiveStore()
        self.objectives.put_objective("critical", 10)
        self.objectives.put_objective("sheddable", -1)
        detector = ConcurrencyDetector(max_concurrency=1)
        spec = FlowControlSpec(default_request_ttl_s=ttl_s)
        self.gate = FlowGate(
            FlowController(FlowSettings(spec=spec)),
            self.table,
            PoolGauge(detector, Freshness(staleness_s=1000.0)),
            self.loop.time,
            self.objectives,
            reclaimer=Reclaimer(grace_s=0.0) if eviction else None,
        )
        self.gate.start()
        self.host = FlowHost(self.gate, self._to_worker, self.sync, self.loop.time)
        self.workers = [
            RemoteFlowGate(lambda msg, i=i: self._to_control(i, msg), self.loop.time, self.objectives, eviction)
            for i in range(workers)
        ]
        self.alive = [True] * workers
        self._in_flight = 0

    def _to_worker(self, worker: int, msg: Any) -> bool:
        if not self.alive[worker]:
            return False
        self.loop.call_soon(self.workers[worker].receive, msg)
        return True

    def _to_control(self, worker: int, msg: Any) -> None:
        self.loop.call_soon(self.host.receive, worker, msg)

    def sync(self) -> None:
        """`WorkerPool.sync_bookings`: the matrix summed into the control's table; a fall wakes the gate."""
        summed = self.matrix.sum(axis=0)
        self.table.set_bookings(np.array([0]), summed)
        if int(summed[:, 0].sum()) < self._in_flight:
            self.gate.wake()
        self._in_flight = int(summed[:, 0].sum())

    async def request(self, worker: int, objective: str = "critical") -> int:
        """A stream on `worker`: held until dispatched (returns the hold responses it sent), then decided and its
        pick booked in the worker's row of the matrix."""
        link = self.workers[worker]
        holds = 0
        async with aclosing(link.hold({OBJECTIVE: objective}, 10)) as held:
            async for _ in held:
                holds += 1
        self.matrix[worker, 0, 0] += 1
        link.decided()
        return holds

    def release(self, worker: int) -> None:
        self.matrix[worker, 0, 0] -= 1
        self.sync()  # the control's publication pass

    async def close(self) -> None:
        await self.gate.shutdown(0)


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_request_queued_on_one_worker_is_dispatched_when_capacity_frees_on_the_other() -> None:
    picker = Picker()
    assert await picker.request(1) == 0  # the pool's one place, taken on worker 1, no hold response
    queued = asyncio.ensure_future(picker.request(0))
    await asyncio.sleep(0.1)
    assert not queued.done() and picker.gate.controller.count == 1  # in the picker's queue, held on worker 0
    picker.release(1)
    assert await asyncio.wait_for(queued, 5) >= 1  # dispatched to worker 0, after holding the stream
    await _turns()
    assert picker.host.pending == 0 and picker.gate.controller.count == 0
    await picker.close()


async def test_priority_order_holds_across_workers() -> None:
    picker = Picker()
    await picker.request(0)
    order: list[str] = []

    async def tracked(worker: int, objective: str) -> None:
        await picker.request(worker, objective)
        order.append(objective)

    sheddable = asyncio.ensure_future(tracked(0, "sheddable"))
    await asyncio.sleep(0.02)
    critical = asyncio.ensure_future(tracked(1, "critical"))
    await asyncio.sleep(0.02)
    picker.release(0)
    await asyncio.wait_for(critical, 5)
    assert order == ["critical"] and not sheddable.done()  # the later, higher band went first
    picker.release(1)
    await asyncio.wait_for(sheddable, 5)
    assert order == ["critical", "sheddable"]
    await picker.close()


async def test_a_queued_request_past_its_ttl_gets_429_ttl_expired_on_its_worker() -> None:
    picker = Picker(ttl_s=0.2)
    await picker.request(0)
    with pytest.raises(EppError) as refused:
        await asyncio.wait_for(picker.request(1), 5)
    assert refused.value.code.http_status == 429
    assert refused.value.dropped_reason == "rejected-ttl-expired"
    await picker.close()


async def test_shutdown_answers_every_queued_request_503_on_every_worker() -> None:
    picker = Picker()
    await picker.request(0)
    queued = [asyncio.ensure_future(picker.request(w)) for w in (0, 1, 1)]
    await asyncio.sleep(0.05)
    await picker.gate.shutdown(0)
    for answer in await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 5):
        assert isinstance(answer, EppError) and answer.dropped_reason == "rejected-shutting-down"


async def test_a_stream_that_goes_away_leaves_the_picker_queue() -> None:
    picker = Picker()
    await picker.request(0)
    queued = asyncio.ensure_future(picker.request(1))
    await asyncio.sleep(0.05)
    assert picker.gate.controller.count == 1
    queued.cancel()
    await _turns()
    assert picker.gate.controller.count == 0 and picker.host.pending == 0
    await picker.close()


async def test_a_worker_that_dies_leaves_nothing_in_the_queues() -> None:
    picker = Picker()
    await picker.request(0)
    queued = asyncio.ensure_future(picker.request(1))
    await asyncio.sleep(0.05)
    picker.alive[1] = False
    picker.host.worker_gone(1)
    assert picker.gate.controller.count == 0 and picker.host.pending == 0
    queued.cancel()
    await picker.close()


async def test_the_control_process_gone_answers_waiting_requests_503() -> None:
    picker = Picker()
    await picker.request(0)
    queued = asyncio.ensure_future(picker.request(1))
    await asyncio.sleep(0.05)
    picker.workers[1].close()
    with pytest.raises(EppError) as refused:
        await asyncio.wait_for(queued, 5)
    assert refused.value.dropped_reason == "rejected-shutting-down"
    with pytest.raises(EppError):  # and every later one
        await picker.request(1)
    await picker.close()


async def test_eviction_the_control_ends_a_sheddable_request_on_the_worker_that_holds_it() -> None:
    picker = Picker(eviction=True)
    evicted = asyncio.Event()
    await picker.request(1, "sheddable")
    handle = picker.workers[1].track({OBJECTIVE: "sheddable"}, evicted.set)
    assert handle is not None
    critical = asyncio.ensure_future(picker.request(0, "critical"))
    await asyncio.wait_for(evicted.wait(), 5)  # the control decided, worker 1 was told
    picker.workers[1].untrack(handle)  # its stream ended (answered 429 evicted)
    picker.release(1)
    await asyncio.wait_for(critical, 5)
    assert picker.gate.reclaimer is not None and picker.gate.reclaimer.confirmed == 1
    await picker.close()
