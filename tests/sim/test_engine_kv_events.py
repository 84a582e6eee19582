"""The engine model's cache as KV-event records: stores, evictions, resets, and an exact replay of its contents."""

from __future__ import annotations

import dataclasses

from epp.sim.engine import Engine, KvCleared, KvRecord, KvRemoved, KvStored, SimRequest
from epp.sim.profiles import H100_LLAMA_8B

SMALL = dataclasses.replace(H100_LLAMA_8B, name="small", num_blocks=40)


def _req(rid: int, group: int, units: int = 16) -> SimRequest:
    prefix = tuple(hash(("g", group, u)) for u in range(units))
    return SimRequest(rid, units * 16, 4, prefix=prefix, unit_tokens=16)


def _drive(engine: Engine, now: float = 0.0) -> float:
    while engine.busy:
        now += engine.begin_step(now)
        engine.end_step(now)
    return now


def _replay(records: list[KvRecord]) -> set[int]:
    cached: set[int] = set()
    for rec in records:
        if isinstance(rec, KvStored):
            cached.update(rec.req.prefix[rec.first : rec.first + rec.units])
        elif isinstance(rec, KvRemoved):
            cached.difference_update(rec.hashes)
        else:
            cached.clear()
    return cached


def test_records_rebuild_exactly_the_cached_units_through_evictions() -> None:
    engine = Engine(SMALL)
    engine.kv_events = []
    now = 0.0
    for rid in range(6):  # 6 × 16 units through a 40-block cache
        engine.submit(_req(rid, group=rid), now)
        now = _drive(engine, now)
    assert any(isinstance(r, KvRemoved) for r in engine.kv_events)
    assert _replay(engine.kv_events) == set(engine._units)


def test_a_request_reusing_a_prefix_stores_only_its_new_units_with_the_right_parent() -> None:
    engine = Engine(SMALL)
    engine.kv_events = []
    engine.submit(_req(1, group=1, units=8), 0.0)
    now = _drive(engine)
    longer = dataclasses.replace(_req(2, group=1, units=12), request_id=2)
    engine.submit(longer, now)
    _drive(engine, now)
    stores = [r for r in engine.kv_events if isinstance(r, KvStored)]
    assert [(s.first, s.units) for s in stores] == [(0, 8), (8, 4)]


def test_reset_forgets_every_unit_and_running_sequences_still_finish() -> None:
    engine = Engine(SMALL)
    engine.kv_events = []
    engine.submit(_req(1, group=1), 0.0)
    now = _drive(engine)
    engine.submit(_req(2, group=1), now)  # will reuse group 1's units...
    now += engine.begin_step(now)
    engine.end_step(now)
    engine.reset_prefix_cache()  # ...while it runs
    assert isinstance(engine.kv_events[-1], KvCleared)
    assert engine.cached_units(_req(3, group=1)) == 0
    _drive(engine, now)
    assert not engine.busy and engine.kv_usage == 0.0
    assert _replay(engine.kv_events) == set(engine._units) == set()


def test_without_a_listener_nothing_is_recorded() -> None:
    engine = Engine(SMALL)
    engine.submit(_req(1, group=1), 0.0)
    _drive(engine)
    engine.reset_prefix_cache()
    assert engine.kv_events is None
