"""The picker's own failure policy: a broken scheduler never hangs or breaks a request.

FailOpen routes to a random candidate (counted as degraded), FailClose refuses with 503; neither widens the
candidate set (the subset hint, and later the residency rules, hold in both), and neither overrides a refusal the
scheduler meant (an EppError such as 429 stays what it is).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datastore import EndpointTable, Snapshot
from epp.datastore.pool import FailureMode
from epp.datastore.table import EndpointInfo, IntArray, MetricsSample
from epp.director import Director
from epp.errors import EppError, ErrorCode
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler, build_scheduler
from epp.scheduling.build import default_config, upstream_default_config
from tests.support.schedulers import RandomScheduler

ADDRESSES = [f"127.10.0.{i}:8000" for i in range(1, 7)]
REQUEST = InferenceRequest(request_id="r1", api=ApiKind.CHAT, model="m1", prompt="hi")


class BrokenScheduler:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: InferenceRequest, now: float) -> Sequence[int]:
        self.calls += 1
        raise self.error


class RecordingObserver:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def degraded_decision(self, reason: str) -> None:
        self.reasons.append(reason)


def table_of(addresses: Sequence[str]) -> EndpointTable:
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in addresses)
    table.synced = True
    return table


def director(
    mode: FailureMode, scheduler: Scheduler, table: EndpointTable | None = None
) -> tuple[Director, RecordingObserver]:
    observer = RecordingObserver()
    chosen = table if table is not None else table_of(ADDRESSES)  # an empty table is falsy
    d = Director(chosen, scheduler, clock=lambda: 100.0, failure_mode=lambda: mode, observer=observer)  # type: ignore[arg-type]
    return d, observer


def inflight(d: Director) -> int:
    return int(np.nansum(d.table.snapshot().inflight))


def test_fail_open_routes_a_scheduler_crash_to_a_candidate_and_counts_it_degraded() -> None:
    d, observer = director(FailureMode.FAIL_OPEN, Scheduler(BrokenScheduler(RuntimeError("bug"))))
    decision = d.decide(REQUEST)
    assert decision.degraded
    assert decision.addresses[0] in ADDRESSES
    assert observer.reasons == ["scheduler-error"]
    assert inflight(d) == 1  # booked like any pick, released on completion
    d.complete(decision)
    assert inflight(d) == 0


def test_fail_close_refuses_a_scheduler_crash_with_503_and_books_nothing() -> None:
    d, observer = director(FailureMode.FAIL_CLOSE, Scheduler(BrokenScheduler(RuntimeError("bug"))))
    with pytest.raises(EppError) as caught:
        d.decide(REQUEST)
    assert caught.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert caught.value.code.http_status == 503
    assert observer.reasons == []
    assert inflight(d) == 0


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
@pytest.mark.parametrize(
    "code", [ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.SERVICE_UNAVAILABLE], ids=["shed-429", "no-fit-503"]
)
def test_a_refusal_the_scheduler_meant_is_kept_in_both_modes(mode: FailureMode, code: ErrorCode) -> None:
    d, observer = director(mode, Scheduler(BrokenScheduler(EppError(code, "saturated"))))
    with pytest.raises(EppError) as caught:
        d.decide(REQUEST)
    assert caught.value.code is code
    assert observer.reasons == []


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_no_endpoint_is_503_in_both_modes_fail_open_invents_none(mode: FailureMode) -> None:
    d, _ = director(mode, Scheduler(BrokenScheduler(RuntimeError("bug"))), table_of([]))
    with pytest.raises(EppError) as caught:
        d.decide(REQUEST)
    assert caught.value.code is ErrorCode.SERVICE_UNAVAILABLE


@settings(max_examples=60, deadline=None)
@given(subset=st.lists(st.sampled_from(ADDRESSES), min_size=1, unique=True))
def test_the_fail_open_fallback_never_leaves_the_candidates(subset: list[str]) -> None:
    d, _ = director(FailureMode.FAIL_OPEN, Scheduler(BrokenScheduler(RuntimeError("bug"))))
    for _ in range(5):
        decision = d.decide(REQUEST, subset=subset)
        assert set(decision.addresses) <= set(subset)
        d.complete(decision)


@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_missing_metrics_never_block_a_decision(mode: FailureMode) -> None:
    # Never scraped: every metric column is NaN (unknown), and the pick still happens, not degraded.
    table = table_of(ADDRESSES)
    assert np.isnan(table.snapshot().waiting).all()
    d, observer = director(mode, Scheduler(RandomScheduler(seed=1)), table)
    decision = d.decide(REQUEST)
    assert decision.addresses[0] in ADDRESSES
    assert not decision.degraded
    assert observer.reasons == []


def stale_table() -> EndpointTable:
    """Scraped once long ago (now = 100 s later) and failing since: every metric is stale."""
    table = table_of(ADDRESSES)
    for i, address in enumerate(ADDRESSES):
        slot = table.slot_of(address)
        assert slot is not None
        table.record_scrape(slot, MetricsSample(waiting=float(i), running=1.0, kv_usage=0.5), now=0.0)
        for _ in range(10):
            table.record_scrape_failure(slot)
    return table


@pytest.mark.parametrize("config", [default_config, upstream_default_config], ids=["ours", "upstream-default"])
@pytest.mark.parametrize("metrics", [lambda: table_of(ADDRESSES), stale_table], ids=["never-scraped", "stale"])
@pytest.mark.parametrize("mode", list(FailureMode), ids=lambda m: m.value)
def test_the_real_profiles_decide_on_missing_or_stale_metrics(
    mode: FailureMode, metrics: object, config: object
) -> None:
    scheduler = build_scheduler(config(), seed=3)  # type: ignore[operator]
    d, observer = director(mode, scheduler, metrics())  # type: ignore[operator]
    for _ in range(20):
        decision = d.decide(REQUEST)
        assert decision.addresses[0] in ADDRESSES
        assert not decision.degraded
        d.complete(decision)
    assert observer.reasons == []
