"""The fused default profile (epp.scheduling.fused, one call into epp/scheduling/_native.c) decides as its plugins
do: on random pools (unknown and out-of-range metrics, stale, failing and never-scraped endpoints, saturated pools,
candidate subsets, prompts that hit the prefix index) the same slots, drawn from the same picker RNG, and the same
totals, pick after pick (each booked, each learned by the prefix index); a detailed pick keeps the same detail (the
kept candidates, their totals, each scorer's name, term row and constant part: what a route receipt reads)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.datastore import EndpointTable
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.scheduling import build_scheduler, upstream_default_config
from epp.scheduling.pick_detail import BUFFERS, SCORED, TERMS
from epp.scheduling.profile import ProfileScheduler
from epp.scheduling.totals import NATIVE
from tests.scheduling.tables import NOW, address, request

needs_native = pytest.mark.skipif(NATIVE is None, reason="the C extension is not built (or EPP_NATIVE=0)")

NAN = math.nan
waiting = st.one_of(
    st.sampled_from([NAN, 0.0, 1.0, 4.0, 5.0, 6.0, math.inf, -1.0]),
    st.integers(0, 12).map(float),
    st.floats(0, 20),
)
kv = st.one_of(st.sampled_from([NAN, 0.0, 0.5, 0.8, 1.0, 1.02, -0.01, math.inf]), st.floats(0, 1))
row = st.fixed_dictionaries(
    {
        "waiting": waiting,
        "kv_usage": kv,
        "age": st.sampled_from([None, 0.0, 1.0, 2.0, 2.5, 100.0]),  # None: never scraped
        "failures": st.integers(0, 4),
        "picks": st.integers(0, 6),
        "prefill": st.sampled_from([0, 0, 1, 300, 1000]),  # each pick's prefill booked (released at its first byte)
        "block_size": st.sampled_from([NAN, 16.0, 32.0]),
    }
)
PROMPTS = ["", "short", "You are a helpful assistant. " * 12 + "question A", "You are a helpful assistant. " * 12]


def _table(rows: list[dict[str, object]]) -> EndpointTable:
    table = EndpointTable(initial_capacity=max(1, len(rows)))
    for i, r in enumerate(rows):
        slot = table.upsert(EndpointInfo(address=address(i), labels={}, pod_name=f"pod-{i}"))
        if r["age"] is not None:
            sample = MetricsSample(waiting=r["waiting"], kv_usage=r["kv_usage"], block_size=r["block_size"])  # type: ignore[arg-type]
            table.record_scrape(slot, sample, now=NOW - r["age"])  # type: ignore[operator]
        for _ in range(int(r["failures"])):  # type: ignore[call-overload]
            table.record_scrape_failure(slot)
        for _ in range(int(r["picks"])):  # type: ignore[call-overload]
            table.book_pick(slot, prefill=int(r["prefill"]))  # type: ignore[call-overload]
    return table


def _handlers(seed: int) -> tuple[ProfileScheduler, ProfileScheduler]:
    fused, plain = build_scheduler(None, seed=seed).handler, build_scheduler(None, seed=seed).handler
    assert isinstance(fused, ProfileScheduler) and isinstance(plain, ProfileScheduler)
    assert fused.fused is not None
    plain.fused = None
    return fused, plain


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, min_size=1, max_size=34),
    subset_bits=st.integers(0, 2**34 - 1),
    prompts=st.lists(st.sampled_from(PROMPTS), min_size=1, max_size=6),
    seed=st.integers(0, 3),
    live=st.booleans(),
)
def test_fused_default_decides_as_its_plugins(rows, subset_bits, prompts, seed, live) -> None:
    # live: the director's snapshot, the table's cached view (the same object pick after pick, its columns the
    # table's own memory, bookings showing through), whose columns the fused run keeps as memoryviews.
    table = _table(rows)
    fused, plain = _handlers(seed)
    for prompt in prompts:
        snap = table.view() if live else table.snapshot()
        candidates = np.array([s for s in snap.slots.tolist() if subset_bits >> s & 1], dtype=np.int64)
        if candidates.size == 0 or (live and subset_bits & 1):
            candidates = snap.slots  # the view's own slot array: the fused run's kept memoryview of it
        totals = fused.fused.totals = np.full(candidates.size, -1.0)  # type: ignore[union-attr]
        got, _ = fused.run(snap, candidates, request(prompt), NOW)
        want, state = plain.run(snap, candidates, request(prompt), NOW, detailed=True)
        assert list(got) == list(want)
        if candidates.size <= 32:
            scored, expected = state.scratch[SCORED]
            np.testing.assert_array_equal(totals[: scored.size], expected)
            assert np.isnan(totals[scored.size :]).all()
        else:
            assert (totals == -1.0).all()  # the plugins ran
        table.book_pick(int(got[0]))


def _assert_same_detail(got: dict[str, object], want: dict[str, object]) -> None:
    (got_scored, got_total), (want_scored, want_total) = got[SCORED], want[SCORED]  # type: ignore[misc]
    np.testing.assert_array_equal(got_scored, want_scored)
    np.testing.assert_array_equal(got_total, want_total)
    (got_named, got_rows), (want_named, want_rows) = got[TERMS], want[TERMS]  # type: ignore[misc]
    assert got_named == want_named
    assert [type(c) for _, _, c in got_named] == [type(c) for _, _, c in want_named]
    if want_rows is None:
        assert got_rows is None
    else:
        assert got_rows is not None and got_rows.shape == want_rows.shape and got_rows.flags.c_contiguous
        np.testing.assert_array_equal(got_rows, want_rows)


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, min_size=1, max_size=34),
    subset_bits=st.integers(0, 2**34 - 1),
    prompts=st.lists(st.sampled_from(PROMPTS), min_size=1, max_size=6),
    detailed=st.lists(st.booleans(), min_size=6, max_size=6),
    seed=st.integers(0, 3),
)
def test_a_detailed_fused_pick_keeps_what_the_plugins_keep(rows, subset_bits, prompts, detailed, seed) -> None:
    table = _table(rows)
    fused, plain = _handlers(seed)
    for prompt, detail in zip(prompts, detailed, strict=False):
        snap = table.snapshot()
        candidates = np.array([s for s in snap.slots.tolist() if subset_bits >> s & 1], dtype=np.int64)
        if candidates.size == 0:
            candidates = snap.slots
        got, got_state = fused.run(snap, candidates, request(prompt), NOW, detailed=detail)
        want, want_state = plain.run(snap, candidates, request(prompt), NOW, detailed=detail)
        assert list(got) == list(want)
        if detail:
            _assert_same_detail(got_state.scratch, want_state.scratch)
            # The fused pick's memoryviews of its arrays (`pick_detail.BUFFERS`) are those arrays.
            (scored, total), (_, terms) = got_state.scratch[SCORED], got_state.scratch[TERMS]
            views = got_state.scratch[BUFFERS]
            np.testing.assert_array_equal(np.asarray(views[0]), scored)
            np.testing.assert_array_equal(np.asarray(views[1]), total)
            assert (views[2] is None) == (terms is None)
            if terms is not None:
                np.testing.assert_array_equal(np.asarray(views[2]), terms)
            assert (
                fused.detail(got_state, int(got[0])).cached_blocks
                == plain.detail(want_state, int(want[0])).cached_blocks
            )
        else:
            assert SCORED not in got_state.scratch and TERMS not in got_state.scratch
        table.book_pick(int(got[0]))


def test_only_the_default_shape_is_fused() -> None:
    handler = build_scheduler(None).handler
    assert isinstance(handler, ProfileScheduler)
    assert (handler.fused is not None) == (NATIVE is not None)
    upstream = build_scheduler(upstream_default_config()).handler
    assert isinstance(upstream, ProfileScheduler) and upstream.fused is None


class _Timer:
    every = 1

    def timed(self, point, plugin, method):  # type: ignore[no-untyped-def]
        return method


def test_an_instrumented_profile_runs_its_plugins() -> None:
    handler = build_scheduler(None).handler
    assert isinstance(handler, ProfileScheduler)
    handler.instrument(_Timer())
    assert handler.fused is None
