"""The demo's shared-prefix chat traffic: every planned request fits the phase, and contexts are shared."""

from __future__ import annotations

import json

import pytest

from epp.demo.traffic import shared_prefix_chat


@pytest.mark.parametrize(("requests", "rate"), [(1, 1.0), (20, 4.0), (120, 8.0)], ids=["one", "small", "default"])
def test_all_requests_arrive_within_the_window_at_the_mean_rate(requests: int, rate: float) -> None:
    shots = shared_prefix_chat(requests, rate, "m", groups=4, context_tokens=64)
    times = [s.at for s in shots]
    assert len(shots) == requests and times == sorted(times) and times[0] == 0.0
    assert times[-1] == pytest.approx((requests - 1) / rate)


def test_requests_share_their_customers_context_and_salts_keep_phases_apart() -> None:
    first = [json.loads(s.body) for s in shared_prefix_chat(40, 10.0, "m", groups=2, context_tokens=64, salt="a")]
    other = [json.loads(s.body) for s in shared_prefix_chat(40, 10.0, "m", groups=2, context_tokens=64, salt="b")]
    contexts = {b["messages"][0]["content"] for b in first}
    assert len(contexts) == 2 and all(len(c) == 64 * 4 for c in contexts)
    assert len({b["messages"][1]["content"] for b in first}) == 40  # every question unique
    assert contexts.isdisjoint({b["messages"][0]["content"] for b in other})
    assert all(b["stream"] is True and b["model"] == "m" for b in first)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        shared_prefix_chat(0, 1.0, "m")
