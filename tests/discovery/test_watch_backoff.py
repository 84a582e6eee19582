"""A watch that answers 410 after every list is re-listed with backoff, and the log says so once.

Reproduction kept from the hardening probe: an API server whose watch answered 410 Gone again and again was
re-listed with no pause, 4,804 API calls in 12 s, one INFO line each.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from epp.discovery.kubernetes.watch import WatchOptions
from tests.discovery.k8s_objects import pod
from tests.discovery.test_watch import PODS, follow  # noqa: F401
from tests.fakes.apiserver import FakeApiServer

OPTIONS = WatchOptions(inactivity_timeout_s=5.0, backoff_initial_s=0.05, backoff_max_s=0.4, log_every_s=60.0)
WINDOW_S = 2.0


def api_calls(api: FakeApiServer) -> int:
    return sum(c.path.endswith("/pods") for c in api.calls)


async def test_410_after_every_list_backs_off_and_logs_once(
    apiserver: FakeApiServer,
    follow,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """4,804 calls in 12 s before; now the re-lists double their pause up to `backoff_max_s` (0.4 s here)."""
    apiserver.apply(pod("vllm-0", ip="127.10.0.7"))
    apiserver.always_gone()
    with caplog.at_level(logging.INFO, logger="epp.discovery.kubernetes.watch"):
        f = follow(PODS, OPTIONS)
        await f.until(lambda: f.lists() >= 1)
        await asyncio.sleep(WINDOW_S)
        calls = api_calls(apiserver)
        lists = f.lists()
    # Pauses of 0.05, 0.1, 0.2, 0.4, 0.4 … s (±20 %): at most ~9 re-lists in 2 s, each with one watch call.
    # A slow machine only makes fewer. Without the backoff this was thousands.
    assert lists <= 12, lists
    assert calls <= 2 * lists + 2, (calls, lists)
    assert f.names() == {"vllm-0"}  # every list still delivered the complete view
    lines = [r for r in caplog.records if "410" in r.getMessage()]
    assert len(lines) <= 2, [r.getMessage() for r in lines]  # the first 410, then one warning for the streak
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_the_watch_recovers_when_the_server_does(apiserver: FakeApiServer, follow) -> None:  # noqa: F811
    apiserver.always_gone()
    f = follow(PODS, OPTIONS)
    await f.until(lambda: f.lists() >= 3)
    apiserver.always_gone(False)
    await asyncio.sleep(1.0)  # let the watch open from the last list
    apiserver.apply(pod("vllm-1", ip="127.10.0.8"))
    await f.until(lambda: "vllm-1" in f.names())
