"""The idle bound's one timer per loop (`epp.extproc.server._IdleSweep`): each stream still ends once it has been
idle for the bound, not before, whatever the other streams do; a stream that receives messages, or is being
decided, is not ended; one timer serves them all, and it is not armed again once no stream is open."""

from __future__ import annotations

import asyncio

from epp.extproc.server import _IDLE, _IdleSweep, _StreamWatch

BOUND_S = 0.2


async def _stream() -> tuple[asyncio.Task[None], asyncio.Future[None]]:
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()

    async def wait() -> None:
        await gate

    task = loop.create_task(wait())
    await asyncio.sleep(0)  # started: it waits, as a stream reading its next message does
    return task, gate


async def test_an_idle_stream_ends_when_its_bound_passes_and_a_busy_one_does_not() -> None:
    loop = asyncio.get_running_loop()
    sweep = _IdleSweep(loop, BOUND_S)
    (idle_task, _), (busy_task, busy_gate) = await _stream(), await _stream()
    idle, busy = _StreamWatch(idle_task), _StreamWatch(busy_task)
    started = loop.time()
    sweep.add(idle)
    sweep.add(busy)
    while not idle_task.done():
        busy.touch()
        await asyncio.sleep(0.02)
    assert loop.time() - started >= BOUND_S  # not before its bound (the loop's clock)
    assert loop.time() - started < BOUND_S + 1.0
    assert idle_task.cancelled() and idle.fired() is _IDLE
    assert not busy_task.done()  # touched within its bound throughout
    busy_gate.set_result(None)
    await busy_task
    sweep.discard(busy)
    assert not sweep.watches


async def test_a_stream_being_decided_is_not_idle_and_ends_a_bound_after_its_decision() -> None:
    loop = asyncio.get_running_loop()
    sweep = _IdleSweep(loop, BOUND_S)
    task, _ = await _stream()
    watch = _StreamWatch(task)
    watch.hold = True  # a render call, a flow-control queue
    sweep.add(watch)
    await asyncio.sleep(BOUND_S * 2.5)
    assert not task.done()
    watch.hold = False
    released = loop.time()
    await asyncio.wait([task], timeout=BOUND_S * 5)
    assert task.cancelled() and watch.fired() is _IDLE
    assert loop.time() - released < BOUND_S + 1.0  # the sweep that saw it held counted its idleness from there


async def test_one_timer_for_every_stream_and_none_again_without_streams() -> None:
    loop = asyncio.get_running_loop()
    sweep = _IdleSweep(loop, BOUND_S)
    made: list[object] = []
    real_call_at = loop.call_at

    def call_at(when: float, callback: object, *args: object, **kwargs: object) -> asyncio.TimerHandle:
        if callback == sweep._sweep:
            made.append(callback)
        return real_call_at(when, callback, *args, **kwargs)  # type: ignore[arg-type]

    loop.call_at = call_at  # type: ignore[method-assign]
    try:
        streams = [await _stream() for _ in range(20)]
        watches = [_StreamWatch(task) for task, _ in streams]
        for watch in watches:
            sweep.add(watch)
        assert len(made) == 1
        for (task, gate), watch in zip(streams, watches, strict=True):
            gate.set_result(None)
            await task
            sweep.discard(watch)
        assert not sweep.watches
        await asyncio.sleep(BOUND_S * 2)  # the armed timer fires, finds no stream, and is not armed again
        assert len(made) == 1
        assert sweep._handle is None
    finally:
        del loop.call_at
