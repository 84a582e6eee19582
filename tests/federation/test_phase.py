"""The heartbeat rule at and around every boundary (3×, 10×, missing, future, interval ≤ 0, clamp)."""

import math

import pytest

from epp.federation.phase import Phase, PhaseRule

C, S, U = Phase.CONNECTED, Phase.STALE, Phase.UNREACHABLE
NOW = 10_000.0
LLMKUBE = PhaseRule()  # clamp to the 30 s delivered cadence, 10 s of tolerated future skew
NO_CLAMP = PhaseRule(delivered_cadence_s=0.0)

CASES = [
    # rule, interval, heartbeat age (s; negative = from the future), expected
    (LLMKUBE, 30, 0.0, C, "fresh"),
    (LLMKUBE, 30, 90.0, C, "exactly-3x-is-connected"),
    (LLMKUBE, 30, 90.001, S, "just-over-3x-is-stale"),
    (LLMKUBE, 30, 300.0, S, "exactly-10x-is-stale"),
    (LLMKUBE, 30, 300.001, U, "just-over-10x-is-unreachable"),
    (LLMKUBE, 30, 86_400.0, U, "a-day-old"),
    (LLMKUBE, 60, 180.0, C, "long-interval-3x"),
    (LLMKUBE, 60, 180.5, S, "long-interval-over-3x"),
    (LLMKUBE, 60, 600.0, S, "long-interval-10x"),
    (LLMKUBE, 60, 600.5, U, "long-interval-over-10x"),
    # interval ≤ 0 means 30 s; absent is the CRD default 30 s
    (NO_CLAMP, 0, 90.0, C, "interval-0-means-30s-at-3x"),
    (NO_CLAMP, 0, 90.5, S, "interval-0-means-30s-over-3x"),
    (NO_CLAMP, -5, 300.0, S, "negative-interval-means-30s-at-10x"),
    (NO_CLAMP, -5, 300.5, U, "negative-interval-means-30s-over-10x"),
    (NO_CLAMP, None, 90.0, C, "absent-interval-is-30s"),
    (NO_CLAMP, None, 90.5, S, "absent-interval-over-3x"),
    # the clamp: a declared 5 s interval is measured against the 30 s the edge agent really delivers
    (LLMKUBE, 5, 20.0, C, "clamped-5s-site-between-pushes-is-connected"),
    (LLMKUBE, 5, 90.0, C, "clamped-5s-at-3x30"),
    (LLMKUBE, 5, 90.5, S, "clamped-5s-over-3x30"),
    (LLMKUBE, 5, 300.5, U, "clamped-5s-over-10x30"),
    (NO_CLAMP, 5, 15.0, C, "unclamped-5s-at-3x"),
    (NO_CLAMP, 5, 15.001, S, "unclamped-5s-over-3x"),
    (NO_CLAMP, 5, 50.0, S, "unclamped-5s-at-10x"),
    (NO_CLAMP, 5, 50.001, U, "unclamped-5s-over-10x"),
    (PhaseRule(delivered_cadence_s=10.0), 5, 30.0, C, "custom-cadence-at-3x"),
    (PhaseRule(delivered_cadence_s=10.0), 5, 30.5, S, "custom-cadence-over-3x"),
    # heartbeats from the future: age 0 within the tolerated skew, Unreachable beyond it
    (LLMKUBE, 30, -1.0, C, "future-by-1s-is-age-0"),
    (LLMKUBE, 30, -10.0, C, "future-at-the-skew-bound"),
    (LLMKUBE, 30, -10.001, U, "future-beyond-the-skew-bound"),
    (LLMKUBE, 30, -3_600.0, U, "future-by-an-hour"),
    (PhaseRule(max_future_skew_s=0.0), 30, -0.001, U, "no-skew-tolerated"),
]


@pytest.mark.parametrize(("rule", "interval", "age", "expected"), [c[:4] for c in CASES], ids=[c[4] for c in CASES])
def test_phase_rule(rule: PhaseRule, interval: float | None, age: float, expected: Phase) -> None:
    assert rule.phase(NOW - age, interval, NOW) is expected


@pytest.mark.parametrize("heartbeat", [None, math.nan], ids=["missing", "nan"])
def test_no_heartbeat_is_unreachable(heartbeat: float | None) -> None:
    phase, reason = LLMKUBE.explain(heartbeat, 30, NOW)
    assert phase is U
    assert reason == "no heartbeat"


def test_the_reason_says_which_threshold_was_crossed() -> None:
    assert "> 3×30s" in LLMKUBE.explain(NOW - 100, 30, NOW)[1]
    assert "future" in LLMKUBE.explain(NOW + 60, 30, NOW)[1]


@pytest.mark.parametrize(
    ("rule", "interval", "expected"),
    [(LLMKUBE, 5, 30.0), (LLMKUBE, 45, 45.0), (NO_CLAMP, 0, 30.0), (NO_CLAMP, None, 30.0), (NO_CLAMP, 7, 7.0)],
    ids=["clamped-up", "above-cadence", "zero", "absent", "unclamped"],
)
def test_effective_interval(rule: PhaseRule, interval: float | None, expected: float) -> None:
    assert rule.effective_interval(interval) == expected
