"""Upstream's producer-fed scorers, table by table against the behaviour upstream documents and tests.

Each test's docstring names the llm-d-router file the expected values come from.
"""

import math

import numpy as np
import pytest

from epp.scheduling.framework import InflightLoad, PrefixMatch, TokenizedPrompt, publish
from epp.scheduling.load_scorers import (
    ActiveRequestScorer,
    ContextLengthAware,
    LoadAwareScorer,
    NoHitLruScorer,
    PrefillQueueScorer,
    ProducedPrefixScorer,
    TokenLoadScorer,
    parse_range,
    range_score,
)
from tests.scheduling.tables import NAN, request, state, table_with


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [([0, 64, 128, 500], [0.5, 0.25, 0.0, 0.0]), ([0, 0], [0.5, 0.5]), ([NAN, 32], [0.25, 0.375])],
)
def test_load_aware_half_at_empty_queue_falling_to_zero_at_threshold(waiting, expected) -> None:
    """pkg/epp/framework/plugins/scheduling/scorer/loadaware/load_aware.go: empty queue 0.5, else
    0.5 × (1 − min(waiting, threshold) / threshold), threshold 128. Unknown queue: ours, the middle (0.25)."""
    snap = table_with([{"waiting": w} for w in waiting]).snapshot()
    assert LoadAwareScorer().score(state(snap), snap.slots).tolist() == pytest.approx(expected)


def _with_inflight(counts, tokens=None):
    table = table_with([{"waiting": 0}] * len(counts))
    for slot, n in enumerate(counts):
        for _ in range(n):
            table.book_pick(slot, (tokens or [0] * len(counts))[slot] // max(n, 1))
    return table.snapshot()


@pytest.mark.parametrize(
    ("counts", "idle", "max_busy", "expected"),
    [
        ([0, 5, 10], 0, 1.0, [1.0, 0.5, 0.0]),
        ([0, 0], 0, 1.0, [1.0, 1.0]),
        ([1, 2, 4], 1, 0.5, [1.0, 0.25, 0.0]),
        ([3, 3], 0, 1.0, [0.0, 0.0]),
    ],
)
def test_active_request_idle_full_score_busy_scaled(counts, idle, max_busy, expected) -> None:
    """pkg/epp/framework/plugins/scheduling/scorer/activerequest/active_request.go: count <= idleThreshold → 1.0,
    else (max − count) / max × maxBusyScore."""
    snap = _with_inflight(counts)
    scorer = ActiveRequestScorer(idle=idle, max_busy=max_busy)
    assert scorer.score(state(snap), snap.slots).tolist() == pytest.approx(expected)


def test_token_load_counts_inflight_tokens_plus_this_requests_uncached_tokens() -> None:
    """pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go: 1 − min(load, threshold) / threshold,
    load = in-flight tokens + the current request's load there; no load → 1.0."""
    snap = table_with([{}, {}, {}]).snapshot()
    st = state(snap, request("x" * 400))  # 100 estimated tokens
    publish(st, "inflight-load-producer", InflightLoad(np.array([0, 0, 0]), np.array([0, 900, 5000]), 100))
    scorer = TokenLoadScorer(threshold=1000)
    assert scorer.score(st, snap.slots).tolist() == pytest.approx([0.9, 0.0, 0.0])
    # 64 of the 100 tokens already cached on slot 0 (4 blocks of 16): only 36 count there
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array([4.0, 0, 0]), 6, 16))
    assert scorer.score(st, snap.slots).tolist() == pytest.approx([0.964, 0.0, 0.0])


def test_token_load_with_nothing_in_flight_and_an_empty_prompt_is_one() -> None:
    """token_load.go: tokenLoad <= 0 scores 1.0."""
    snap = table_with([{}, {}]).snapshot()
    assert TokenLoadScorer().score(state(snap, request("")), snap.slots).tolist() == [1.0, 1.0]


def test_prefill_queue_scores_queued_prefill_plus_own_uncached_tokens_least_wait_one() -> None:
    """Ours: wait = this picker's prefill tokens queued there (booked, first byte not yet) + this request's tokens
    not cached there; score = least wait / wait."""
    table = table_with([{}, {}, {}])
    table.book_prefill(1, 300)
    table.book_prefill(2, 100)
    snap = table.snapshot()
    st = state(snap, request("x" * 400))  # 100 estimated tokens
    scorer = PrefillQueueScorer()
    assert scorer.score(st, snap.slots).tolist() == pytest.approx([1.0, 0.25, 0.5])


def test_prefill_queue_weighs_a_cached_prefix_against_a_queue_in_one_unit() -> None:
    """Ours: an endpoint holding 64 of the 100 tokens with 50 tokens queued (wait 86) beats an idle one that
    must compute all 100; with 80 queued (wait 116) the idle one wins."""
    for queued, expected in ((50, [1.0, 0.86]), (80, [100 / 116, 1.0])):
        table = table_with([{}, {}])
        table.book_prefill(0, queued)
        snap = table.snapshot()
        st = state(snap, request("x" * 400))
        publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array([4.0, 0]), 6, 16))
        assert PrefillQueueScorer().score(st, snap.slots).tolist() == pytest.approx(expected)


def test_prefill_queue_notes_the_picks_uncached_tokens_for_the_booking() -> None:
    """Ours: `picked` keeps the chosen endpoint's uncached tokens as scored; `uncached` hands them out once,
    then (nothing noted) every prompt token."""
    snap = table_with([{}, {}]).snapshot()
    st = state(snap, request("x" * 400))
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array([4.0, 0]), 6, 16))
    scorer = PrefillQueueScorer()
    scorer.score(st, snap.slots)
    scorer.picked(st, 0)
    assert scorer.uncached(0, 100) == 36
    assert scorer.uncached(0, 100) == 100


@pytest.mark.parametrize(
    ("matched", "total", "weight", "scale", "expected"),
    [
        ([5, 2], 10, 0.0, 0, [0.5, 0.2]),
        ([5, 2], 10, 0.5, 100, [0.25125, 0.1002]),
        ([0, 0], 0, 0.0, 0, [0.0, 0.0]),
        ([10, 0], 10, 1.0, 5, [1.0, 0.0]),
    ],
)
def test_prefix_scorer_from_a_producer(matched, total, weight, scale, expected) -> None:
    """pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go and plugin_test.go (TestPrefixPluginScore,
    TestPrefixPluginScoreWithWeights, block size 1): w · min(1, matched·block/scale)² + (1 − w) · matched/total;
    totalBlocks 0 → 0."""
    snap = table_with([{}, {}]).snapshot()
    st = state(snap)
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array(matched, dtype=float), total, 1))
    scorer = ProducedPrefixScorer("p", "approx-prefix-cache-producer", weight, scale)
    assert scorer.score(st, snap.slots).tolist() == pytest.approx(expected)


def test_prefix_scorer_without_producer_data_scores_zero() -> None:
    """plugin.go: a missing PrefixCacheMatchInfo scores 0."""
    snap = table_with([{}, {}]).snapshot()
    assert ProducedPrefixScorer("p", "nobody").score(state(snap), snap.slots).tolist() == [0.0, 0.0]


def test_no_hit_lru_ranks_never_used_first_then_least_recently_used() -> None:
    """pkg/epp/framework/plugins/scheduling/scorer/nohitlru/no_hit_lru.go: cold request (no endpoint has a match):
    rank r → 1 − r/(n−1), never-used endpoints first in candidate order, then LRU oldest first; the pick of a cold
    request moves its endpoint to the most recent end; a warm request scores 0.5 everywhere."""
    snap = table_with([{}, {}, {}]).snapshot()
    scorer = NoHitLruScorer()

    def cold_state():
        st = state(snap)
        publish(st, "approx-prefix-cache-producer", PrefixMatch(np.zeros(3), 4, 16))
        return st

    assert scorer.score(cold_state(), snap.slots).tolist() == [1.0, 0.5, 0.0]
    st = cold_state()
    scorer.score(st, snap.slots)
    scorer.picked(st, 0)  # slot 0 took a cold request
    assert scorer.score(cold_state(), snap.slots).tolist() == [0.0, 1.0, 0.5]
    st = cold_state()
    scorer.score(st, snap.slots)
    scorer.picked(st, 1)
    assert scorer.score(cold_state(), snap.slots).tolist() == [0.5, 0.0, 1.0]
    warm = state(snap)
    publish(warm, "approx-prefix-cache-producer", PrefixMatch(np.array([0.0, 2.0, 0.0]), 4, 16))
    assert scorer.score(warm, snap.slots).tolist() == [0.5, 0.5, 0.5]
    scorer.picked(warm, 2)  # a warm pick does not touch the LRU
    assert scorer.score(cold_state(), snap.slots).tolist() == [0.5, 0.0, 1.0]


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("0-2048", (0, 2048)), (" 10 - 20 ", (10, 20)), ("20-10", None), ("abc", None), ("1-2-3", None), ("", None)],
)
def test_context_range_label_parsing(value, parsed) -> None:
    """context_length_aware.go parseContextRange: "min-max" integers, min <= max."""
    assert parse_range(value) == parsed


@pytest.mark.parametrize(
    ("tokens", "bounds", "expected"),
    [
        (1000, (1000, 1000), 1.0),
        (0, (0, 10000), 0.3 + (0.7 * 0.5 + 0.3 * 1.0) * 0.7),
        (9000, (0, 8192), 0.3 / (1 + 808 / 1000)),
        (9000, (0, 2048), 0.3 / (1 + 6952 / 1000)),
        (100, (2048, 8192), 0.3 / (1 + 1948 / 1000)),
    ],
)
def test_context_range_score(tokens, bounds, expected) -> None:
    """context_length_aware.go calculateRangeScore: in range 0.3 + (0.7/(1+width/10000) + 0.3·headroom/width)·0.7,
    out of range 0.3/(1 + distance/1000)."""
    assert range_score(tokens, bounds) == pytest.approx(expected)


def test_context_length_aware_scores_labels_and_filters_only_when_enabled() -> None:
    """contextlengthaware/README.md: unlabelled 0.5, malformed 0; enableFiltering drops labelled endpoints whose
    range excludes the request (and malformed ones), keeps unlabelled ones."""
    label = "llm-d.ai/context-length-range"
    labels = [{label: "0-2048"}, {label: "2048-8192"}, {}, {label: "bad"}]
    snap = table_with([{}] * 4, labels=labels).snapshot()
    st = state(snap, request("x" * 4000))  # 1000 tokens
    st_scores = ContextLengthAware().score(st, snap.slots).tolist()
    assert st_scores[0] > 0.3 > st_scores[1] > 0.0
    assert st_scores[2:] == [0.5, 0.0]
    assert ContextLengthAware().filter(st, snap.slots).tolist() == [0, 1, 2, 3]
    assert ContextLengthAware(filtering=True).filter(st, snap.slots).tolist() == [0, 2]


def test_context_length_prefers_engine_tokens_when_produced() -> None:
    """context_length_aware.go getContextLength: the TokenizedPrompt's token count when present."""
    label = "llm-d.ai/context-length-range"
    snap = table_with([{}], labels=[{label: "0-10"}]).snapshot()
    st = state(snap, request("x" * 4000))
    publish(st, "token-producer", TokenizedPrompt(5, b"\0" * 20, exact=True))
    assert ContextLengthAware(filtering=True).filter(st, snap.slots).tolist() == [0]


def test_unknown_signals_never_make_a_score_nan() -> None:
    """Ours: NaN metrics (never scraped) stay finite for every load scorer."""
    snap = table_with([{"scraped": False}, {"waiting": NAN}]).snapshot()
    for scorer in (LoadAwareScorer(), ActiveRequestScorer(), TokenLoadScorer(), PrefillQueueScorer()):
        assert all(math.isfinite(v) for v in scorer.score(state(snap), snap.slots))
