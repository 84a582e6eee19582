"""The index: keys recomputed from token ids, longest prefix per endpoint, the memory bound, clears and groups."""

from __future__ import annotations

import random

import pytest

from epp.kvevents.blockkeys import BlockKeys
from epp.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored
from epp.kvevents.index import KvBlockIndex

A, B, C = "127.10.0.1:8000", "127.10.0.2:8000", "127.10.0.3:8000"
_RNG = random.Random(7)
TOKENS = [_RNG.randrange(128_000) for _ in range(16 * 40)]


def _stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = 16, **kw: object) -> BlockStored:
    return BlockStored(hashes, parent, tokens, size, None, kw.pop("medium", "GPU"), **kw)  # type: ignore[arg-type]


def test_event_keys_and_request_keys_agree_block_by_block_and_in_closed_form() -> None:
    keys = BlockKeys(16, max_blocks=64)
    values = keys.block_values(keys.tokens_array(TOKENS))
    chained = keys.chain(keys.root("lora"), values)
    assert keys.request_keys(TOKENS, "lora").tolist() == chained
    # resuming from any key gives the rest of the chain: an event's parent is enough
    assert keys.chain(chained[9], values[10:]) == chained[10:]
    # a different adapter, seed or block size gives different keys
    assert keys.request_keys(TOKENS).tolist()[0] != chained[0]
    assert BlockKeys(16, seed="s").request_keys(TOKENS, "lora").tolist()[0] != chained[0]


def test_a_request_is_capped_at_max_blocks_but_events_of_any_length_are_hashed() -> None:
    keys = BlockKeys(16, max_blocks=7)
    assert len(keys.request_keys(TOKENS)) == 7
    assert len(keys.block_values(keys.tokens_array(TOKENS))) == 40
    assert (
        keys.chain(keys.root(), keys.block_values(keys.tokens_array(TOKENS)))[:7] == keys.request_keys(TOKENS).tolist()
    )


def test_longest_prefix_per_endpoint_follows_chains_across_events() -> None:
    index = KvBlockIndex()
    index.apply(A, [_stored([1, 2, 3], None, TOKENS[:48])], 1.0)
    index.apply(A, [_stored([4, 5], 3, TOKENS[48:80])], 1.0)  # continues from engine block 3
    index.apply(B, [_stored([11, 12], None, TOKENS[:32])], 1.0)
    index.apply(C, [_stored([21], None, [9] * 16)], 1.0)
    keys = index.request_keys(TOKENS)
    assert index.match(keys) == {A: 5, B: 2}
    assert index.match(keys, [B, C]) == {B: 2}
    assert index.match(keys[:1]) == {A: 1, B: 1}
    assert index.match([]) == {}


def test_engine_block_size_a_multiple_of_ours_maps_each_engine_block_to_several_keys() -> None:
    index = KvBlockIndex(block_size=16)
    index.apply(A, [_stored([1, 2], None, TOKENS[:128], size=64)], 1.0)
    index.apply(A, [_stored([3], 2, TOKENS[128:192], size=64)], 1.0)
    assert index.match(index.request_keys(TOKENS)) == {A: 12}
    index.apply(A, [BlockRemoved([2], "GPU")], 2.0)
    assert index.match(index.request_keys(TOKENS)) == {A: 4}
    index.apply(B, [_stored([7], None, TOKENS[:24], size=24)], 1.0)  # neither of 24 and 16 divides the other
    assert index.counters.skipped["block_size"] == 1


def test_removed_blocks_cut_the_prefix_and_clears_drop_one_endpoint_only() -> None:
    index = KvBlockIndex()
    index.apply(A, [_stored([1, 2, 3, 4], None, TOKENS[:64])], 1.0)
    index.apply(B, [_stored([1, 2, 3, 4], None, TOKENS[:64])], 1.0)
    index.apply(A, [BlockRemoved([3, 4], "GPU")], 2.0)
    keys = index.request_keys(TOKENS)
    assert index.match(keys) == {A: 2, B: 4}
    index.apply(B, [AllBlocksCleared()], 3.0)
    assert index.match(keys) == {A: 2}
    assert index.blocks(B) == 0 and index.counters.cleared == 1
    index.remove_endpoint(A)
    assert index.match(keys) == {} and index.holders == {}


def test_a_store_whose_parent_is_unknown_is_skipped_and_counted() -> None:
    index = KvBlockIndex()
    index.apply(A, [_stored([5], 4, TOKENS[16:32])], 1.0)
    assert index.blocks(A) == 0 and index.counters.skipped["orphan"] == 1


def test_offloaded_and_sliding_window_blocks_are_not_a_prefix_hit() -> None:
    index = KvBlockIndex()
    index.apply(A, [_stored([1], None, TOKENS[:16], medium="CPU")], 1.0)
    index.apply(A, [_stored([2], None, TOKENS[:16], group_idx=1, kv_cache_spec_kind="sliding_window")], 1.0)
    assert index.blocks(A) == 0
    index.apply(A, [_stored([3], None, TOKENS[:16], group_idx=0, kv_cache_spec_kind="full_attention")], 1.0)
    index.apply(A, [_stored([4], 3, TOKENS[16:32], group_idx=0)], 1.0)  # the group's kind was learnt
    index.apply(A, [BlockRemoved([4], "GPU", 1)], 1.0)  # a removal in the sliding-window group: not ours
    assert index.match(index.request_keys(TOKENS)) == {A: 2}
    assert index.counters.skipped["medium"] == 1 and index.counters.skipped["cache_kind"] == 1


def test_bad_token_ids_skip_that_event_only() -> None:
    index = KvBlockIndex()
    index.apply(A, [_stored([1], None, [-1] * 16), _stored([2], None, TOKENS[:16])], 1.0)
    assert index.blocks(A) == 1 and index.counters.skipped["bad_tokens"] == 1


def test_the_bound_evicts_the_oldest_stored_blocks_first() -> None:
    index = KvBlockIndex(max_blocks_per_endpoint=3)
    for i in range(5):
        index.apply(A, [_stored([100 + i], None, TOKENS[i * 16 : (i + 1) * 16])], float(i))
    assert index.blocks(A) == 3 and index.counters.evicted_blocks == 2
    assert len(index.holders) == 3
    index.apply(A, [_stored([200], None, TOKENS[:16])], 9.0)  # block 0 again, newest now
    assert index.match(index.request_keys(TOKENS)) == {A: 1}


def test_entries_age_is_the_time_since_the_endpoints_last_event() -> None:
    index = KvBlockIndex()
    assert index.age(A, 5.0) == float("inf")
    index.apply(A, [], 2.0)
    assert index.age(A, 5.0) == pytest.approx(3.0)


def test_many_endpoints_each_get_their_own_slot_and_freed_slots_are_reused() -> None:
    index = KvBlockIndex()
    names = [f"127.10.1.{i}:8000" for i in range(100)]
    for i, name in enumerate(names):
        index.apply(name, [_stored([1, 2], None, TOKENS[:32] if i % 2 else TOKENS[:16] + [0] * 16)], 1.0)
    keys = index.request_keys(TOKENS)
    got = index.match(keys)
    assert got == {n: 2 if i % 2 else 1 for i, n in enumerate(names)}
    index.remove_endpoint(names[3])
    index.apply("127.10.2.1:8000", [_stored([1], None, TOKENS[:16])], 1.0)
    assert index.match(keys)["127.10.2.1:8000"] == 1 and names[3] not in index.match(keys)


@pytest.mark.parametrize("ours", [32, 64])
def test_engine_blocks_smaller_than_ours_are_summed_into_ours_across_events(ours: int) -> None:
    """vLLM's 16-token blocks under upstream's sample's blockSize 64: an index block is held once the engine block
    that completes it is stored, whichever event it comes in, and the keys are the request's keys."""
    index = KvBlockIndex(block_size=ours)
    tokens = TOKENS[: 16 * 40]
    index.apply(A, [_stored([1, 2, 3, 4, 5], None, tokens[:80])], 1.0)  # ends inside one of ours
    index.apply(A, [_stored(list(range(6, 41)), 5, tokens[80:])], 1.0)
    keys = index.request_keys(tokens)
    assert index.match(keys) == {A: len(tokens) // ours}
    assert index.counters.skipped["block_size"] == 0
    index.apply(A, [BlockRemoved([8], "GPU")], 2.0)  # engine block 8 (tokens 112..128) completes one of ours
    assert index.match(keys) == {A: 128 // ours - 1}
    index.apply(A, [AllBlocksCleared()], 3.0)
    assert index.match(keys) == {} and index.holders == {}


def test_the_mirror_is_told_each_write_once_with_every_changed_keys_last_mask() -> None:
    told: list[dict[int, int]] = []
    index = KvBlockIndex(max_blocks_per_endpoint=4, mirror=lambda changes: told.append(dict(changes)))
    index.apply(A, [_stored([1, 2, 3], None, TOKENS[:48]), BlockRemoved([3], "GPU"), _stored([4], 2, TOKENS[:16])], 1.0)
    k = index.request_keys(TOKENS)
    assert len(told) == 1 and told[0][k[0]] == told[0][k[1]] == 1 and told[0][k[2]] == 0
    assert {key: m for key, m in told[0].items() if m} == index.holders
    index.apply(B, [_stored([1, 2], None, TOKENS[:32])], 1.0)
    assert told[-1] == {k[0]: 0b11, k[1]: 0b11}
    index.apply(A, [_stored([5, 6], 4, TOKENS[16:48])], 2.0)  # over the bound: the oldest, block 1, evicted
    assert told[-1][k[0]] == 0b10 and index.blocks(A) == 4
    index.clear(B)  # a gap: its own write
    assert told[-1] == {k[0]: 0, k[1]: 0b01}
    index.remove_endpoint(A)
    assert all(m == 0 for m in told[-1].values()) and index.holders == {}
    index.apply(A, [], 3.0)  # nothing changed: nothing told
    assert len(told) == 5
