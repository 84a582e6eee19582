import base64

import pytest

from epp.scheduling.affinity import LoraAffinityScorer, SessionAffinityScorer
from tests.scheduling.tables import NAN, address, request, state, table_with

LORA_CASES = [
    pytest.param(dict(max_lora=2, running_adapters=("a",), waiting_adapters=()), 1.0, id="active"),
    pytest.param(dict(max_lora=2, running_adapters=("b",), waiting_adapters=()), 0.8, id="room-to-load"),
    pytest.param(dict(max_lora=2, running_adapters=("b",), waiting_adapters=("a",)), 0.6, id="waiting-no-room"),
    pytest.param(dict(max_lora=1, running_adapters=("b",), waiting_adapters=()), 0.0, id="full-elsewhere"),
    pytest.param(dict(max_lora=NAN), 0.5, id="max-lora-unknown"),
    pytest.param(dict(max_lora=NAN, running_adapters=("a",)), 1.0, id="active-without-max-lora"),
]


@pytest.mark.parametrize(("row", "expected"), LORA_CASES)
def test_lora_affinity_table(row, expected) -> None:
    snap = table_with([row]).snapshot()
    got = LoraAffinityScorer().score(state(snap, request(model="a")), snap.slots)
    assert got.tolist() == [expected]


def test_lora_cache_follows_new_scrapes() -> None:
    scorer = LoraAffinityScorer()
    table = table_with([dict(max_lora=1, running_adapters=("b",))])
    snap = table.snapshot()
    assert scorer.score(state(snap, request(model="a")), snap.slots).tolist() == [0.0]
    from epp.datastore.table import MetricsSample

    table.record_scrape(0, MetricsSample(max_lora=1, running_adapters=("a",)), now=1.0)
    snap = table.snapshot()
    assert scorer.score(state(snap, request(model="a")), snap.slots).tolist() == [1.0]


def test_session_sticks_to_the_endpoint_of_the_first_pick() -> None:
    scorer = SessionAffinityScorer()
    snap = table_with([{}, {}, {}]).snapshot()
    req = request(session="s1")
    assert scorer.score(state(snap, req), snap.slots).tolist() == [0, 0, 0]
    scorer.picked(state(snap, req), 2)
    assert scorer.score(state(snap, req), snap.slots).tolist() == [0, 0, 1]
    assert scorer.score(state(snap, request(session="other")), snap.slots).tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(base64.b64encode(address(1).encode()).decode(), id="base64-address"),
        pytest.param(base64.b64encode(b"default/pod-1").decode(), id="base64-namespaced-pod"),
    ],
)
def test_session_accepts_upstream_style_tokens(token) -> None:
    snap = table_with([{}, {}]).snapshot()
    got = SessionAffinityScorer().score(state(snap, request(session=token)), snap.slots)
    assert got.tolist() == [0, 1]


def test_session_token_that_is_garbage_scores_nothing() -> None:
    snap = table_with([{}, {}]).snapshot()
    got = SessionAffinityScorer().score(state(snap, request(session="%%not base64")), snap.slots)
    assert got.tolist() == [0, 0]


def test_lora_room_reported_in_unusable_data_is_unknown() -> None:
    table = table_with([dict(max_lora=1, running_adapters=("b",)), dict(max_lora=2, running_adapters=("b",))])
    for _ in range(3):
        table.record_scrape_failure(1)  # failing: its room is no longer known
    snap = table.snapshot()
    assert LoraAffinityScorer().score(state(snap, request(model="a")), snap.slots).tolist() == [0.0, 0.5]
