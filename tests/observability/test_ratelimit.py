"""Repeating log lines: the first one shows, the repeats are counted into the next line that shows."""

from __future__ import annotations

import logging

import pytest

from epp.observability.ratelimit import RateLimitedLog


def test_one_line_per_interval_per_key_with_the_count_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    quiet = RateLimitedLog(logging.getLogger("t"), every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="t"):
        assert quiet.log("a", logging.WARNING, "fault %s", 1)
        for _ in range(5):
            assert not quiet.log("a", logging.WARNING, "fault %s", 2)
        assert quiet.log("b", logging.INFO, "other")  # keys are independent
        now[0] = 10.0
        assert quiet.log("a", logging.WARNING, "fault %s", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "fault 1",
        "other",
        "fault 3 (5 similar lines held back in the last 10s)",
    ]
