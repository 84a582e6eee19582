"""`wait_set`, the one wait "for a change, or at the latest in N seconds" of every loop in the picker: it ends on
the event or on the timeout, and a cancel always ends it, also the one that lands in the loop turn the event is set
(on Python 3.11 `asyncio.wait_for` drops that cancel, and a shutdown that awaits the task waits for ever).
Bounded by loop turns, not by time."""

from __future__ import annotations

import asyncio

import pytest

from epp.supervision.loop import wait_set

LONG_S = 3600.0  # never reached: each test ends within a few loop turns


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_wait_ends_when_the_event_is_set() -> None:
    async def main() -> None:
        event = asyncio.Event()
        task = asyncio.create_task(wait_set(event, LONG_S))
        await _turns(2)
        assert not task.done()
        event.set()
        await _turns(3)
        assert task.done() and task.exception() is None

    asyncio.run(main())


def test_the_wait_ends_at_its_timeout_with_the_event_set() -> None:
    async def main() -> None:
        event = asyncio.Event()
        await wait_set(event, 0.0)
        assert event.is_set()
        late = asyncio.Event()
        await wait_set(late, -1.0)  # a deadline already past waits for nothing
        assert late.is_set()

    asyncio.run(main())


def test_a_cancel_landing_in_the_turn_the_event_is_set_ends_the_waiting_task() -> None:
    async def main() -> None:
        event = asyncio.Event()

        async def waiter() -> None:
            while True:
                await wait_set(event, LONG_S)
                event.clear()

        task = asyncio.create_task(waiter())
        await _turns(2)
        event.set()
        task.cancel()  # the same turn
        await _turns(5)
        assert task.done()
        with pytest.raises(asyncio.CancelledError):
            task.result()

    asyncio.run(main())


def test_no_timer_is_left_behind_after_the_event_ends_the_wait() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        event = asyncio.Event()
        event.set()
        await wait_set(event, LONG_S)
        assert event.is_set()
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(live) <= before

    asyncio.run(main())
