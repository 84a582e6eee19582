import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling.prefix import PrefixCacheScorer, PrefixIndex, learn_pick
from tests.scheduling.tables import request, state, table_with

SYSTEM = "You are a helpful assistant. " * 20  # ~580 bytes: 9 blocks of 64


def test_score_is_matched_leading_blocks_over_total() -> None:
    scorer = PrefixCacheScorer()
    snap = table_with([{}, {}]).snapshot()
    first = request(SYSTEM + "question one " * 10)
    scorer.score(state(snap, first), snap.slots)
    scorer.picked(state(snap, first), 1)
    second = request(SYSTEM + "something else entirely " * 10)
    scores = scorer.score(state(snap, second), snap.slots)
    total = len(SYSTEM + "something else entirely " * 10) // 64
    assert scores[0] == 0
    assert scores[1] == len(SYSTEM) // 64 / total


def test_a_short_prompt_scores_zero_everywhere() -> None:
    snap = table_with([{}, {}]).snapshot()
    assert PrefixCacheScorer().score(state(snap, request("hi")), snap.slots).tolist() == [0, 0]


def test_different_models_do_not_share_cache() -> None:
    scorer = PrefixCacheScorer()
    snap = table_with([{}, {}]).snapshot()
    scorer.score(state(snap, request(SYSTEM, model="a")), snap.slots)
    scorer.picked(state(snap, request(SYSTEM, model="a")), 0)
    assert scorer.score(state(snap, request(SYSTEM, model="b")), snap.slots).tolist() == [0, 0]


def test_auto_tune_uses_the_engine_block_size() -> None:
    scorer = PrefixCacheScorer(block_size=64)
    snap = table_with([{"block_size": 32}]).snapshot()  # 32 tokens × 4 bytes = 128-byte blocks
    st = state(snap, request("z" * 1024))
    scorer.score(st, snap.slots)
    hashes, _, _ = st.scratch[scorer._key]
    assert len(hashes) == 1024 // 128


def test_index_evicts_oldest_generation_when_capacity_is_reached() -> None:
    index = PrefixIndex(default_capacity=8)
    index.add(0, "a", [1, 2, 3, 4], 0, capacity=8)  # young fills to 4 = capacity/2 → rotates
    index.add(0, "a", [5, 6, 7, 8], 0, capacity=8)  # rotates again: 1-4 evicted
    m = index.match([1, 2], size=1)
    assert m.tolist() == [0]
    assert index.match([5, 6, 7, 8], size=1).tolist() == [4]


def test_refreshed_blocks_survive_eviction() -> None:
    index = PrefixIndex(default_capacity=8)
    index.add(0, "a", [1, 2, 3, 4], 0, capacity=8)
    index.add(0, "a", [1, 2, 9, 10], 2, capacity=8)  # 1, 2 re-sent: refreshed
    assert index.match([1, 2], size=1).tolist() == [2]
    assert index.match([3], size=1).tolist() == [0]


def test_a_reused_slot_does_not_inherit_the_old_endpoint_cache() -> None:
    from epp.datastore.table import EndpointInfo

    scorer = PrefixCacheScorer()
    table = table_with([{}, {}])
    snap = table.snapshot()
    scorer.score(state(snap, request(SYSTEM)), snap.slots)
    scorer.picked(state(snap, request(SYSTEM)), 0)
    table.remove(snap.addresses[0])
    table.upsert(EndpointInfo(address="127.10.9.9:8000"))  # takes slot 0
    snap = table.snapshot()
    assert scorer.score(state(snap, request(SYSTEM)), snap.slots).tolist() == [0, 0]
    assert len(scorer.index) == 0


def test_match_handles_many_holders_via_bit_unpacking() -> None:
    index = PrefixIndex(default_capacity=1000)
    for slot in range(100):
        index.add(slot, f"e{slot}", [11, 12], 0, capacity=1000)
    index.add(7, "e7", [11, 12, 13], 2, capacity=1000)
    m = index.match([11, 12, 13], size=100)
    expected = np.full(100, 2.0)
    expected[7] = 3
    assert m.tolist() == expected.tolist()


# A pick learned from another serving worker (`learn_pick`) skips its match when the add would change nothing
# (`PrefixIndex.holds_young`); the index must end exactly as the definition, a match and an add every time, leaves it.
# The capacity moves between picks, as an auto-tuned one does when a scrape reports other GPU blocks.
_CHAINS = [[(chain << 8) | depth for depth in range(1, 9)] for chain in range(3)]
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["learn", "learn", "foreign"]),
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(1, 8),
        st.sampled_from([2, 6, 12, 24]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_a_learned_pick_leaves_the_index_as_a_match_and_an_add_would(ops: list[tuple[str, int, int, int, int]]) -> None:
    snap = table_with([{}, {}, {}]).snapshot()
    fast, definition = PrefixIndex(2), PrefixIndex(2)
    for op, slot, chain, depth, capacity in ops:
        hashes = _CHAINS[chain][:depth]
        fast.default_capacity = definition.default_capacity = capacity
        if op == "foreign":  # the slot recorded for another endpoint: the next learn must start it afresh
            for index in (fast, definition):
                index.add(slot, "127.10.9.9:8000", hashes, 0, capacity)
            continue
        learn_pick(fast, snap, slot, hashes, auto_tune=False)
        definition.sync(snap)
        held = int(definition.match(hashes, slot + 1)[slot])
        definition.add(slot, snap.addresses[slot], hashes, held, capacity, definition.reach)
        assert (fast._holders, fast._young, fast._old, fast._owner) == (
            definition._holders,
            definition._young,
            definition._old,
            definition._owner,
        )
