import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling.saturation import SaturationDetector
from tests.scheduling.tables import NAN, NOW, request, table_with


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param([dict(waiting=0, kv_usage=0.0)] * 2, 0.0, id="idle"),
        pytest.param([dict(waiting=5, kv_usage=0.0), dict(waiting=0, kv_usage=0.4)], 0.75, id="roofline-mean"),
        pytest.param([dict(waiting=10, kv_usage=0.9)], 2.0, id="queue-bound"),
        pytest.param([dict(waiting=NAN, kv_usage=0.8)], 1.0, id="nan-side-ignored"),
        pytest.param([dict(waiting=NAN, kv_usage=NAN)], 0.0, id="nothing-known-is-not-load"),
        pytest.param([dict(scraped=False), dict(waiting=0, kv_usage=0.0)], 0.5, id="stale-counts-full"),
    ],
)
def test_saturation_table(rows, expected) -> None:
    snap = table_with(rows).snapshot()
    assert SaturationDetector().saturation(snap, snap.slots, NOW) == pytest.approx(expected)


def test_own_picks_since_scrape_raise_saturation() -> None:
    table = table_with([dict(waiting=0, kv_usage=0.0)])
    detector = SaturationDetector()
    assert not detector.saturated(table.snapshot(), table.snapshot().slots, NOW)
    for _ in range(5):
        table.book_pick(0)
    snap = table.snapshot()
    assert detector.saturated(snap, snap.slots, NOW)


def test_no_candidates_is_saturated() -> None:
    import numpy as np

    snap = table_with([{}]).snapshot()
    assert SaturationDetector().saturation(snap, np.zeros(0, dtype=np.int64), NOW) == 1.0


signal = st.one_of(st.just(NAN), st.floats(0, 12))
filter_row = st.fixed_dictionaries(
    {"waiting": signal, "kv_usage": st.one_of(st.just(NAN), st.floats(0, 1.2)), "scraped": st.booleans()}
)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(filter_row, min_size=1, max_size=16), stale=st.lists(st.booleans(), min_size=16, max_size=16))
def test_the_filter_keeps_the_same_endpoints_on_small_and_large_pools(rows, stale) -> None:
    """Up to 32 candidates the exact filter runs on lists, beyond on numpy: the same rows, the same verdicts."""
    from epp.scheduling.framework import CycleState
    from epp.scheduling.saturation import SaturationFilter

    def kept(copies: int) -> list[int]:
        table = table_with(rows * copies)
        for slot in range(len(rows) * copies):
            if stale[slot % len(rows)]:
                for _ in range(3):
                    table.record_scrape_failure(slot)
        snap = table.snapshot()
        state = CycleState(snap, snap.slots, request(), NOW)
        return SaturationFilter().filter(state, snap.slots).tolist()

    small, large = kept(1), kept(33 // len(rows) + 1)  # ≤ 16 candidates, then more than 32 of the same rows
    assert [s for s in large if s < len(rows)] == small


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(filter_row, min_size=1, max_size=40), picks=st.lists(st.integers(0, 39), max_size=40))
def test_the_filter_keeps_exactly_the_usable_endpoints_under_the_limits(rows, picks) -> None:
    """The filter's one rule, endpoint by endpoint: usable data, effective queue and KV usage under the limits
    (unknown is not over); everyone when that would leave no one. The extremes-based shortcut agrees."""
    from epp.datastore import Freshness, usable
    from epp.scheduling.framework import CycleState
    from epp.scheduling.saturation import SaturationFilter

    table = table_with(rows)
    for slot in picks:
        if slot < len(rows):
            table.book_pick(slot)
    snap = table.snapshot()
    freshness = Freshness()
    expected = [
        slot
        for slot in range(len(rows))
        if usable(float(snap.scraped_at[slot]), int(snap.scrape_failures[slot]), NOW, freshness)
        and not (snap.waiting[slot] + snap.picks_since_scrape[slot] >= 5 or snap.kv_usage[slot] >= 0.8)
    ]
    state = CycleState(snap, snap.slots, request(), NOW, freshness)
    assert SaturationFilter().filter(state, snap.slots).tolist() == (expected or list(range(len(rows))))


# -- concurrency-detector: upstream's three modes ----------------------------------------------------------------


def _loaded(loads: list[tuple[int, int]]):
    """A pool whose endpoint i holds loads[i] = (requests, prompt tokens) of ours in flight."""
    table = table_with([dict(waiting=0, kv_usage=0.0)] * len(loads))
    for slot, (requests, tokens) in enumerate(loads):
        for i in range(requests):
            table.book_pick(slot, tokens // requests + (1 if i < tokens % requests else 0))
    return table.snapshot()


def test_concurrency_requests_mode_is_the_pools_requests_over_its_request_capacity() -> None:
    from epp.scheduling.saturation import ConcurrencyDetector

    snap = _loaded([(50, 900_000), (0, 0)])
    assert ConcurrencyDetector(max_concurrency=100).saturation(snap, snap.slots, NOW) == pytest.approx(0.25)


def test_concurrency_tokens_mode_is_the_pools_tokens_over_its_token_capacity() -> None:
    from epp.scheduling.saturation import ConcurrencyDetector

    snap = _loaded([(2, 1500), (1, 500)])
    detector = ConcurrencyDetector(mode="tokens", max_token_concurrency=1000)
    assert detector.saturation(snap, snap.slots, NOW) == pytest.approx(1.0)  # 2000 / (1000 × 2)


def test_concurrency_hybrid_mode_shows_endpoints_full_on_different_dimensions() -> None:
    from epp.scheduling.saturation import ConcurrencyDetector

    # endpoint 0 is full on requests (10/10), endpoint 1 on tokens (1000/1000): neither aggregate ratio shows it
    snap = _loaded([(10, 10), (1, 1000)])
    detector = ConcurrencyDetector(max_concurrency=10, mode="hybrid", max_token_concurrency=1000)
    assert detector.saturation(snap, snap.slots, NOW) == pytest.approx(1.0)
    assert ConcurrencyDetector(max_concurrency=10).saturation(snap, snap.slots, NOW) == pytest.approx(0.55)
    tokens = ConcurrencyDetector(mode="tokens", max_token_concurrency=1000)
    assert tokens.saturation(snap, snap.slots, NOW) == pytest.approx(0.505)


@pytest.mark.parametrize(
    ("mode", "kept"),
    [("requests", [1, 2]), ("tokens", [0, 2]), ("hybrid", [2])],
)
def test_concurrency_filter_drops_endpoints_at_the_limit_of_its_mode(mode, kept) -> None:
    from epp.scheduling.saturation import ConcurrencyDetector
    from tests.scheduling.tables import state

    # endpoint 0 at the request limit (12 = 10 × 1.2), endpoint 1 at the token limit (1200), endpoint 2 under both
    snap = _loaded([(12, 12), (1, 1200), (11, 1100)])
    detector = ConcurrencyDetector(max_concurrency=10, headroom=0.2, mode=mode, max_token_concurrency=1000)
    assert detector.filter(state(snap), snap.slots).tolist() == kept


def test_concurrency_filter_keeps_every_endpoint_when_all_are_at_the_limit() -> None:
    from epp.scheduling.saturation import ConcurrencyDetector
    from tests.scheduling.tables import state

    snap = _loaded([(5, 5000), (5, 5000)])
    detector = ConcurrencyDetector(max_concurrency=1, mode="hybrid", max_token_concurrency=1)
    assert detector.filter(state(snap), snap.slots).tolist() == [0, 1]


def test_concurrency_detector_parameters_are_upstreams_with_their_defaults() -> None:
    from epp.config.decode import parse_config
    from epp.errors import ConfigError
    from epp.scheduling import build_scheduler

    def built(parameters: dict) -> object:
        doc = {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"type": "concurrency-detector", "parameters": parameters}, {"type": "max-score-picker"}],
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "concurrency-detector"}]}],
            "saturationDetector": {"pluginRef": "concurrency-detector"},
        }
        return build_scheduler(parse_config(doc)).saturation

    default = built({})
    assert (default.mode, default.max_concurrency, default.max_token_concurrency, default.headroom) == (
        "requests", 100, 1_000_000, 0.0,
    )  # fmt: skip
    hybrid = built({"concurrencyMode": "hybrid", "maxTokenConcurrency": 4096, "inFlightLoadProducerName": "x"})
    assert (hybrid.mode, hybrid.max_token_concurrency) == ("hybrid", 4096)
    with pytest.raises(ConfigError, match=r"concurrencyMode.*'bytes': expected requests, tokens or hybrid"):
        built({"concurrencyMode": "bytes"})
    with pytest.raises(ConfigError, match="maxTokenConcurrency"):
        built({"maxTokenConcurrency": 0})
