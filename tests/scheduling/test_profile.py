"""Properties of whole picks through the profile runner (the director's Scheduler seam)."""

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from epp.datastore.table import MetricsSample
from epp.scheduling import build_scheduler, upstream_default_config
from epp.scheduling.framework import CycleState
from tests.scheduling.tables import NAN, NOW, request, table_with

metric = st.one_of(st.just(NAN), st.floats(0, 50))
usage = st.one_of(st.just(NAN), st.floats(0, 1))
row = st.fixed_dictionaries({"waiting": metric, "running": metric, "kv_usage": usage, "scraped": st.booleans()})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, min_size=1, max_size=24),
    subset_bits=st.integers(1, 2**24 - 1),
    prompt=st.text(max_size=400),
    profile=st.sampled_from(["ours", "upstream"]),
)
def test_a_pick_is_always_a_candidate_inside_the_subset(rows, subset_bits, prompt, profile) -> None:
    snap = table_with(rows).snapshot()
    subset = np.array([s for s in snap.slots if subset_bits >> s & 1], dtype=np.int64)
    if subset.size == 0:
        subset = snap.slots[:1]
    scheduler = build_scheduler(None if profile == "ours" else upstream_default_config(), seed=1)
    for _ in range(3):
        picked = scheduler.handler.pick(snap, subset, request(prompt), NOW)
        assert len(picked) == 1
        assert picked[0] in subset.tolist()


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=24), prompt=st.text(max_size=300))
def test_every_scorer_stays_in_unit_interval(rows, prompt) -> None:
    snap = table_with(rows).snapshot()
    from epp.scheduling.affinity import LoraAffinityScorer, SessionAffinityScorer
    from epp.scheduling.prefix import PrefixCacheScorer
    from epp.scheduling.scorers import InflightLoadScorer, KvCacheUtilizationScorer, QueueScorer, RunningRequestsScorer

    state = CycleState(snap, snap.slots, request(prompt, session="s"), NOW)
    for scorer in (
        QueueScorer(),
        KvCacheUtilizationScorer(),
        PrefixCacheScorer(block_size=8),
        InflightLoadScorer(),
        LoraAffinityScorer(),
        RunningRequestsScorer(),
        SessionAffinityScorer(),
    ):
        scores = scorer.score(state, snap.slots)
        assert scores.shape == snap.slots.shape
        assert np.all((scores >= 0) & (scores <= 1)), scorer.type_name


big = st.one_of(st.just(NAN), st.floats(0, 1e6), st.floats(0, 1e-300))  # wide and subnormal ranges too
wide_row = st.fixed_dictionaries({"waiting": big, "running": big, "kv_usage": usage, "scraped": st.booleans()})


@settings(max_examples=80, deadline=None)
@example(  # a subnormal range: its reciprocal times the weight 2 overflowed, and 0 × inf made the total NaN
    rows=[
        {"waiting": 0.0, "running": NAN, "kv_usage": NAN, "scraped": True},
        {"waiting": 1.1125369292536007e-308, "running": NAN, "kv_usage": NAN, "scraped": True},
    ],
    picks=[],
    failing=[],
)
@given(
    rows=st.lists(wide_row, min_size=1, max_size=40),
    picks=st.lists(st.integers(0, 39), max_size=30),
    failing=st.lists(st.integers(0, 39), max_size=10),
)
def test_the_runner_total_is_the_weighted_sum_of_the_linear_scores(rows, picks, failing) -> None:
    """Each linear scorer computes its score once, as a `Linear`; the runner's multiply-adds of those forms give
    the same total as weighting and adding the scores they stand for, with NaN, subnormal ranges, unusable data."""
    from epp.scheduling.prefix import PrefixCacheScorer
    from epp.scheduling.profile import ProfileScheduler, SchedulingProfile, WeightedScorer
    from epp.scheduling.scorers import InflightLoadScorer, KvCacheUtilizationScorer, QueueScorer, RunningRequestsScorer

    class Capture:
        type_name = name = "capture"
        total = None

        def pick(self, state, candidates, scores):
            Capture.total = scores.copy()
            return (int(candidates[0]),)

    table = table_with(rows)
    for slot in picks:
        if slot < len(rows):
            table.book_pick(slot)
    for slot in failing:
        if slot < len(rows):
            for _ in range(3):
                table.record_scrape_failure(slot)
    snap = table.view()
    prompt = request("the same prompt " * 8)
    prefix = PrefixCacheScorer(block_size=8)
    warm = CycleState(snap, snap.slots, prompt, NOW)
    prefix.index.add(0, snap.addresses[0], prefix._state(warm, snap.slots)[0], 0, 100)
    scorers = (QueueScorer(), KvCacheUtilizationScorer(), InflightLoadScorer(), RunningRequestsScorer(), prefix)
    weights = (2.0, 3.0, 0.5, 1.0, 1.5)
    weighted = tuple(WeightedScorer(s, w) for s, w in zip(scorers, weights, strict=True))
    ProfileScheduler(SchedulingProfile("p", (), weighted, Capture())).pick(snap, snap.slots, prompt, NOW)
    state = CycleState(snap, snap.slots, prompt, NOW)
    expected = sum(w * s.score(state, snap.slots) for s, w in zip(scorers, weights, strict=True))
    np.testing.assert_allclose(Capture.total, np.fmax(expected, 0.0), rtol=0, atol=1e-9)


def test_the_runner_adds_linear_and_general_scorers_with_their_weights() -> None:
    from epp.scheduling.framework import sanitize
    from epp.scheduling.profile import ProfileScheduler, SchedulingProfile, WeightedScorer
    from epp.scheduling.scorers import KvCacheUtilizationScorer, QueueScorer

    class Recorder:  # a general (not linear, unbounded) scorer
        type_name = name = "recorder"

        def score(self, state, candidates):
            return np.linspace(-1.0, 2.0, candidates.size)

    class Picker:
        type_name = name = "capture"
        total = None

        def pick(self, state, candidates, scores):
            Picker.total = scores.copy()
            return (int(candidates[0]),)

    snap = table_with([{"waiting": w, "kv_usage": k} for w, k in ((0.0, 0.1), (4.0, 0.9), (2.0, 0.5))]).snapshot()
    weights = (2.0, 3.0, 0.5)
    scorers = (QueueScorer(), KvCacheUtilizationScorer(), Recorder())
    profile = SchedulingProfile(
        "p", (), tuple(WeightedScorer(s, w) for s, w in zip(scorers, weights, strict=True)), Picker()
    )
    ProfileScheduler(profile).pick(snap, snap.slots, request(), NOW)
    state = CycleState(snap, snap.slots, request(), NOW)
    expected = sum(w * sanitize(np.array(s.score(state, snap.slots))) for s, w in zip(scorers, weights, strict=True))
    np.testing.assert_allclose(Picker.total, np.fmax(expected, 0.0), atol=1e-12)


def test_equal_endpoints_share_picks_evenly() -> None:
    table = table_with([dict(waiting=1, running=1, kv_usage=0.2)] * 8)
    scheduler = build_scheduler(upstream_default_config(), seed=3)
    snap = table.snapshot()
    counts = Counter(scheduler.handler.pick(snap, snap.slots, request(), NOW)[0] for _ in range(4000))
    assert len(counts) == 8
    assert max(counts.values()) / min(counts.values()) < 1.3


def _burst(scheduler, prompts):
    table = table_with([dict(waiting=w, running=4, kv_usage=0.3) for w in (0, 1, 1, 2, 2, 3, 3, 3)])
    counts: Counter[int] = Counter()
    for prompt in prompts:  # no scrape in between: only the picker's own bookings change
        snap = table.snapshot()
        slot = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)[0]
        table.book_pick(slot)
        counts[slot] += 1
    return counts


def test_a_burst_between_two_scrapes_spreads_instead_of_herding() -> None:
    distinct = [f"request {i}: " + "lorem ipsum " * 30 for i in range(100)]
    upstream = _burst(build_scheduler(upstream_default_config(), seed=1), distinct)
    ours = _burst(build_scheduler(None, seed=1), distinct)
    assert upstream.most_common(1)[0][1] == 100  # upstream: every request to the emptiest-looking endpoint
    assert len(ours) == 8
    assert ours.most_common(1)[0][1] <= 20


def test_a_same_prefix_burst_is_bounded_by_the_saturation_filter() -> None:
    shared = ["You are a support bot. " * 40 + f"ticket {i}" for i in range(100)]
    ours = _burst(build_scheduler(None, seed=1), shared)
    assert len(ours) >= 4
    assert ours.most_common(1)[0][1] < 50


def test_stale_or_missing_metrics_never_block_a_pick() -> None:
    table = table_with([{"scraped": False}] * 3)
    snap = table.snapshot()
    assert build_scheduler(None).handler.pick(snap, snap.slots, request("x" * 200), NOW)


def test_a_scrape_resets_what_the_inflight_scorer_counts() -> None:
    table = table_with([dict(waiting=0), dict(waiting=0)])
    for _ in range(3):
        table.book_pick(0)
    table.record_scrape(0, MetricsSample(waiting=0), now=NOW)
    assert table.snapshot().picks_since_scrape.tolist() == [0, 0]
