"""The degradation alarms in the simulator: the picker's own director and scheduler over `epp.sim` engine models, in
virtual time (`benchmarks.virtual_time.simulate`, the routing-quality harness). Each scenario runs healthy, then
broken, then fixed again: the alarm must be raised within 1,000 requests of the break, cleared within 1,000 of the
fix, and no alarm may be up in the healthy phase."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from benchmarks.policies import MODEL, Picker, PrecisePicker
from benchmarks.virtual_time import simulate
from benchmarks.workloads import UNIT_TOKENS, Item, SimRequest, scaled_arrivals
from epp.config.decode import parse_config
from epp.scheduling import build_scheduler
from epp.scheduling.prefix import PrefixCacheScorer
from epp.sim.engine import Engine
from epp.sim.profiles import profile_named

SERVERS = 4
HEALTHY, BROKEN, FIXED = 600, 1000, 1000  # requests per phase
WITHIN = 1000


def _items(n: int, groups: int, unique: range | None = None, own_unit: bool = False) -> list[Item]:
    """Customers with shared contexts (`groups` of them, two units each) asking unique questions; inside `unique`,
    every prompt's context is its own. `own_unit`: each question is a whole unit of its own (the engine stores it:
    a KV event per request, as a real engine's prefill of new blocks publishes)."""
    rng = np.random.default_rng(7)
    picks = rng.integers(0, groups, n)
    items = []
    for i in range(n):
        base = (1_000_000 + i) if unique is not None and i in unique else int(picks[i])
        units = (base * 1000, base * 1000 + 1, *((2_000_000_000 + i,) if own_unit else ()))
        items.append(Item(float(i), len(units) * UNIT_TOKENS + 64, 32, units))
    return items


class _Phased:
    """Wraps a picker policy: `fault(index)` says whether request `index` arrives while the fault is on; records
    the watch's active alarms after each pick."""

    def __init__(self, inner: Picker, broken: range, apply: Callable[[bool], None] | None = None) -> None:
        self.inner = inner
        self.broken = broken
        self._apply = apply
        self._on = False
        self.active: list[set[tuple[str, str]]] = []
        self.name = inner.name
        self.reads_scrapes = inner.reads_scrapes
        self.wants_kv_events = inner.wants_kv_events

    def pick(self, index: int, item: Item, req: SimRequest, now: float) -> int:
        on = index in self.broken
        if on != self._on and self._apply is not None:
            self._apply(on)
        self._on = on
        server = self.inner.pick(index, item, req, now)
        watch = self.inner.director.watch
        assert watch is not None
        self.active.append({(p, r) for p, r, up, _ in watch.states() if up})
        return server

    def first_token(self, server: int, index: int, ttft_s: float) -> None:
        self.inner.first_token(server, index, ttft_s)

    def done(self, server: int, index: int, fin: Any = None) -> None:
        self.inner.done(server, index, fin)

    def scrape(self, engines: Sequence[Engine], now: float) -> None:
        self.inner.scrape(engines, now)

    def kv_records(self, server: int, records: Any, now: float) -> None:
        self.inner.kv_records(server, records, now)


def _run(policy: Callable[[Sequence[Engine], Callable[[], float]], _Phased], items: list[Item], rate: float) -> _Phased:
    made: list[_Phased] = []

    def factory(engines: Sequence[Engine], clock: Callable[[], float]) -> _Phased:
        made.append(policy(engines, clock))
        return made[0]

    simulate(items, scaled_arrivals(items, rate), [profile_named("h100")] * SERVERS, factory)
    return made[0]


def _check(run: _Phased, alarm: tuple[str, str]) -> None:
    """No alarm while healthy; `alarm` within WITHIN requests of the break; cleared within WITHIN of the fix."""
    healthy = set().union(*run.active[:HEALTHY])
    assert not healthy, f"alarms in the healthy phase: {healthy}"
    broken = run.active[HEALTHY : HEALTHY + BROKEN]
    raised = next((i for i, active in enumerate(broken) if alarm in active), None)
    assert raised is not None and raised < WITHIN, f"{alarm} not raised within {WITHIN} requests: {broken[-1]}"
    fixed = run.active[HEALTHY + BROKEN :]
    cleared = next((i for i, active in enumerate(fixed) if alarm not in active), None)
    assert cleared is not None and cleared < WITHIN, f"{alarm} not cleared within {WITHIN} requests"
    assert alarm not in fixed[-1]


BROKEN_RANGE = range(HEALTHY, HEALTHY + BROKEN)
TOTAL = HEALTHY + BROKEN + FIXED


def test_frozen_metrics_of_one_endpoint_raise_stale_signal_and_clear() -> None:
    class Frozen(Picker):
        frozen = False

        def scrape(self, engines: Sequence[Engine], now: float) -> None:
            slots = self.slots
            if self.frozen:  # endpoint 0's row stops updating (its scrape hangs): the others are scraped
                self.slots = slots[1:]
                engines = engines[1:]
            try:
                super().scrape(engines, now)
            finally:
                self.slots = slots

    def policy(engines: Sequence[Engine], clock: Callable[[], float]) -> _Phased:
        inner = Frozen("epp", SERVERS, build_scheduler(None, seed=1), clock)
        return _Phased(inner, BROKEN_RANGE, lambda on: setattr(inner, "frozen", on))

    run = _run(policy, _items(TOTAL, groups=16), rate=40.0)
    _check(run, ("metrics-data-source", "stale_signal"))


def test_every_prompt_unique_raises_constant_prefix_output_and_clears() -> None:
    def policy(engines: Sequence[Engine], clock: Callable[[], float]) -> _Phased:
        return _Phased(Picker("epp", SERVERS, build_scheduler(None, seed=1), clock), BROKEN_RANGE)

    run = _run(policy, _items(TOTAL, groups=16, unique=BROKEN_RANGE), rate=20.0)
    _check(run, ("prefix-cache-scorer", "constant_output"))
    assert not any(("prefix-cache-scorer", "prefix_never_hits") in a for a in run.active)  # nothing repeats


def _config(lru: int) -> Any:
    return parse_config(
        {
            "apiVersion": "llm-d.ai/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [
                {"type": "prefix-cache-scorer", "parameters": {"lruCapacityPerServer": lru, "autoTune": False}},
                {"type": "queue-scorer"},
                {"type": "max-score-picker"},
            ],
            "schedulingProfiles": [
                {
                    "name": "default",
                    "plugins": [
                        {"pluginRef": "prefix-cache-scorer", "weight": 3},
                        {"pluginRef": "queue-scorer", "weight": 1},
                        {"pluginRef": "max-score-picker"},
                    ],
                }
            ],
        },
        "<test>",
    )


def test_mis_sized_prefix_lru_raises_prefix_never_hits_and_clears() -> None:
    def policy(engines: Sequence[Engine], clock: Callable[[], float]) -> _Phased:
        scheduler = build_scheduler(_config(31250), seed=1)
        scorer = scheduler.prefix_scorers[0]
        assert isinstance(scorer, PrefixCacheScorer)

        def resize(on: bool) -> None:  # a config reload with lruCapacityPerServer too small for the traffic
            scorer.index.default_capacity = 2 if on else 31250
            if on:
                for slot in range(SERVERS):
                    scorer.index.forget(slot)

        return _Phased(Picker("epp", SERVERS, scheduler, clock), BROKEN_RANGE, resize)

    run = _run(policy, _items(TOTAL, groups=64), rate=20.0)
    _check(run, ("prefix-cache-scorer", "prefix_never_hits"))


def test_broken_kv_events_feed_raises_stale_signal_and_clears() -> None:
    class Silent(PrecisePicker):
        silent = False

        def kv_records(self, server: int, records: Any, now: float) -> None:
            if not self.silent:  # the feed is cut: the engines keep caching, no event reaches the index
                super().kv_records(server, records, now)

    def policy(engines: Sequence[Engine], clock: Callable[[], float]) -> _Phased:
        inner = Silent(SERVERS, 1, clock, 0.01)
        return _Phased(inner, BROKEN_RANGE, lambda on: setattr(inner, "silent", on))

    run = _run(policy, _items(TOTAL, groups=16, own_unit=True), rate=40.0)
    producer = run.inner.scheduler.kv_events
    assert producer is not None
    _check(run, (producer.name, "stale_signal"))


@pytest.fixture(autouse=True)
def _model() -> None:
    assert MODEL  # the harness's model name, on every request
