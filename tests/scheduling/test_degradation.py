"""The degradation watch in virtual time: each condition raises an episode after a window that was mostly bad,
clears it after one that was mostly good, and counts episodes; a flicker does neither."""

from __future__ import annotations

from epp.scheduling.degradation import WINDOW, DegradationWatch, Transition
from epp.scheduling.receipt import METRICS_SOURCE, Receipt


def _receipt(**fields: object) -> Receipt:
    base: dict[str, object] = dict(
        profiles=("default",),
        chosen="127.0.0.1:8000",
        runner_up="127.0.0.2:8000",
        scorers=("queue-scorer", "prefix-cache-scorer"),
        chosen_terms=(1.0, 0.0),
        runner_terms=(0.5, 0.0),
        constant=(False, False),
        metrics_age_s=0.02,
        stale=0,
        missing=0,
        kv=(),
        kv_age_s=float("nan"),
        tokens=(),
        prefix=(),
        candidates=2,
    )
    base.update(fields)
    return Receipt(**base)  # type: ignore[arg-type]


PAIRS = [
    ("queue-scorer", "constant_output"),
    ("prefix-cache-scorer", "constant_output"),
    (METRICS_SOURCE, "stale_signal"),
    (METRICS_SOURCE, "missing_signal"),
    ("precise", "stale_signal"),
    ("precise", "missing_signal"),
    ("precise", "always_fallback"),
    ("tokens", "always_fallback"),
    ("prefix-cache-scorer", "prefix_never_hits"),
]


def _feed(watch: DegradationWatch, receipt: Receipt, n: int, t0: float) -> list[Transition]:
    out: list[Transition] = []
    for i in range(n):
        out += watch.observe(receipt, t0 + i * 0.01)
    return out


def _active(watch: DegradationWatch) -> set[tuple[str, str]]:
    return {(p, r) for p, r, up, _ in watch.states() if up}


def test_healthy_receipts_raise_nothing() -> None:
    watch = DegradationWatch(PAIRS)
    assert _feed(watch, _receipt(), 10 * WINDOW, 0.0) == []
    assert _active(watch) == set()


def test_inert_scorer_raises_constant_output_after_a_window_and_clears_after_a_good_one() -> None:
    watch = DegradationWatch(PAIRS)
    bad = _receipt(constant=(False, True))
    transitions = _feed(watch, bad, WINDOW, 100.0)
    assert [(t.plugin, t.reason, t.active) for t in transitions] == [("prefix-cache-scorer", "constant_output", True)]
    assert transitions[0].now == 100.0 + (WINDOW - 1) * 0.01  # time is the caller's
    assert watch.active(101.0)[0]["plugin"] == "prefix-cache-scorer"
    assert _feed(watch, bad, 3 * WINDOW, 101.0) == []  # once per episode
    cleared = _feed(watch, _receipt(), WINDOW, 200.0)
    assert [(t.reason, t.active) for t in cleared] == [("constant_output", False)]
    assert dict(((p, r), n) for p, r, _, n in watch.states())[("prefix-cache-scorer", "constant_output")] == 1
    _feed(watch, bad, WINDOW, 300.0)
    assert dict(((p, r), n) for p, r, _, n in watch.states())[("prefix-cache-scorer", "constant_output")] == 2


def test_a_flickering_condition_neither_raises_nor_clears() -> None:
    watch = DegradationWatch(PAIRS)
    bad, good = _receipt(stale=1), _receipt()
    for i in range(4 * WINDOW):
        watch.observe(bad if i % 2 else good, float(i))
    assert _active(watch) == set()


def test_metrics_rows_stale_and_missing_are_their_own_conditions() -> None:
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(stale=1), WINDOW, 0.0)
    assert _active(watch) == {(METRICS_SOURCE, "stale_signal")}
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(missing=2), WINDOW, 0.0)
    assert _active(watch) == {(METRICS_SOURCE, "missing_signal")}


def test_precise_producer_conditions() -> None:
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(kv=(("precise", "approximate", 1, 0),)), WINDOW, 0.0)
    assert _active(watch) == {("precise", "stale_signal")}
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(kv=(("precise", "approximate", 0, 1),)), WINDOW, 0.0)
    assert _active(watch) == set()  # one endpoint never heard from (no traffic yet) is not a silent feed
    _feed(watch, _receipt(kv=(("precise", "approximate", 0, 2),)), WINDOW, 1.0)
    assert _active(watch) == {("precise", "missing_signal")}  # none of the candidates ever heard from
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(kv=(("precise", "no_tokens", 0, 0),)), WINDOW, 0.0)
    assert _active(watch) == {("precise", "always_fallback")}


def test_render_always_falling_back_to_the_estimate() -> None:
    watch = DegradationWatch(PAIRS)
    _feed(watch, _receipt(tokens=(("tokens", False),)), WINDOW, 0.0)
    assert _active(watch) == {("tokens", "always_fallback")}
    _feed(watch, _receipt(tokens=(("tokens", True),)), WINDOW, 1.0)
    assert _active(watch) == set()


def test_prefix_never_hits_counts_only_prompts_that_repeat() -> None:
    watch = DegradationWatch(PAIRS)
    # Every prompt unique, nothing matched: not this alarm (nothing could have hit).
    for i in range(4 * WINDOW):
        watch.observe(_receipt(prefix=(("prefix-cache-scorer", 1000 + i, 0),)), float(i))
    assert _active(watch) == set()
    # The same leading blocks again and again, never matched: the index forgets (LRU too small).
    for i in range(WINDOW + 1):
        watch.observe(_receipt(prefix=(("prefix-cache-scorer", 7, 0),)), 100.0 + i)
    assert _active(watch) == {("prefix-cache-scorer", "prefix_never_hits")}
    for i in range(WINDOW):
        watch.observe(_receipt(prefix=(("prefix-cache-scorer", 7, 3),)), 200.0 + i)
    assert _active(watch) == set()


def test_pairs_not_watched_are_ignored() -> None:
    watch = DegradationWatch([("queue-scorer", "constant_output")])
    _feed(watch, _receipt(stale=1, constant=(True, True)), WINDOW, 0.0)
    assert _active(watch) == {("queue-scorer", "constant_output")}
    assert watch.pairs == (("queue-scorer", "constant_output"),)
