"""The in-process driver of benchmarks/stream_path.py routes every request through the real state machine."""

import pytest

from benchmarks.stream_path import PROFILES, build


@pytest.mark.parametrize("profile", list(PROFILES))
def test_each_profile_runs_whole_requests_through_the_picker(profile: str) -> None:
    one = build(PROFILES[profile])
    for _ in range(120):  # crosses two simulated scrapes
        one()
