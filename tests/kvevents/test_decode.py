"""The decoder reads every encoding of vLLM's KVEventBatch, and nothing it is given crashes it (or the index).

The reference encoder is msgspec with vLLM's own struct definitions (`vllm/distributed/kv_events.py`): field
order, which fields have defaults, `omit_defaults`, `tag=True`, and `array_like=True` for the array encoding or the
map encoding tagged under "type" (vllm#42892). Shorter arrays (older vLLM, trailing defaults omitted) and longer
ones (fields from a future vLLM) are written by hand.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.kvevents.decode import (
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    MalformedBatch,
    decode_batch,
    engine_key,
)
from epp.kvevents.index import KvBlockIndex

Hash = int | bytes


def reference_encoder(array_like: bool) -> SimpleNamespace:
    """vLLM's event structs, as vLLM declares them, in one of its two encodings."""

    class EventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[Hash]
        parent_block_hash: Hash | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[Hash]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return SimpleNamespace(
        EventBatch=EventBatch, BlockStored=BlockStored, BlockRemoved=BlockRemoved, AllBlocksCleared=AllBlocksCleared
    )


ARRAY, MAP = reference_encoder(True), reference_encoder(False)
TOKENS = list(range(1000, 1032))
SHA = [bytes([i]) * 32 for i in range(1, 4)]


def _encode(ref: SimpleNamespace, events: list[Any], rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode(ref.EventBatch(1733000000.5, events, rank))


def _one(payload: bytes) -> Any:
    batch = decode_batch(payload)
    assert batch.skipped == 0
    assert len(batch.events) == 1
    return batch.events[0]


@pytest.mark.parametrize("ref", [ARRAY, MAP], ids=["array-like", "map-tagged-type"])
@pytest.mark.parametrize("hashes", [SHA[:2], [-(2**63), 2**63 - 1]], ids=["bytes-hashes", "int64-hashes"])
def test_block_stored_in_each_encoding_and_hash_type(ref: SimpleNamespace, hashes: list[Hash]) -> None:
    ev = _one(_encode(ref, [ref.BlockStored(hashes, None, TOKENS, 16, None, "GPU", None)]))
    assert isinstance(ev, BlockStored)
    assert (ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size) == (hashes, None, TOKENS, 16)
    assert (ev.medium, ev.lora_id, ev.lora_name, ev.extra_keys, ev.group_idx) == ("GPU", None, None, None, None)


@pytest.mark.parametrize("ref", [ARRAY, MAP], ids=["array-like", "map-tagged-type"])
def test_every_block_stored_field_round_trips(ref: SimpleNamespace) -> None:
    stored = ref.BlockStored(
        [SHA[1]], SHA[0], TOKENS[:16], 16, 7, "GPU", "sql-lora", [("mm-hash", 0), None], 1, "sliding_window", 4096
    )
    ev = _one(_encode(ref, [stored], rank=3))
    assert ev.parent_block_hash == SHA[0]
    assert (ev.lora_id, ev.lora_name, ev.group_idx, ev.kv_cache_spec_kind) == (7, "sql-lora", 1, "sliding_window")
    assert ev.kv_cache_spec_sliding_window == 4096
    assert ev.extra_keys is not None and len(ev.extra_keys) == 2
    assert decode_batch(_encode(ref, [stored], rank=3)).data_parallel_rank == 3


@pytest.mark.parametrize("ref", [ARRAY, MAP], ids=["array-like", "map-tagged-type"])
def test_block_removed_and_all_blocks_cleared(ref: SimpleNamespace) -> None:
    batch = decode_batch(_encode(ref, [ref.BlockRemoved(SHA, "GPU", 2), ref.AllBlocksCleared()]))
    removed, cleared = batch.events
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium, removed.group_idx) == (SHA, "GPU", 2)
    assert isinstance(cleared, AllBlocksCleared)
    assert batch.ts == 1733000000.5


def test_trailing_defaults_omitted_as_older_engines_send_them() -> None:
    events = [
        ["BlockStored", [11, 12], None, TOKENS, 16],  # before lora_id existed
        ["BlockStored", [13], 12, TOKENS[:16], 16, None],  # lora_id, no medium
        ["BlockStored", [14], 13, TOKENS[:16], 16, None, "GPU"],  # medium, no lora_name
        ["BlockRemoved", [11]],  # no medium
        ["AllBlocksCleared"],
    ]
    batch = decode_batch(msgspec.msgpack.encode([12.0, events]))  # no data_parallel_rank either
    assert batch.skipped == 0 and batch.data_parallel_rank is None
    assert [type(e).__name__ for e in batch.events] == ["BlockStored"] * 3 + ["BlockRemoved", "AllBlocksCleared"]
    assert batch.events[2].medium == "GPU"  # type: ignore[union-attr]


def test_fields_from_a_future_engine_are_ignored() -> None:
    stored = ["BlockStored", [1], None, TOKENS[:16], 16, None, "GPU", None, None, None, None, None, "new", 5]
    removed = ["BlockRemoved", [1], "GPU", None, "new-field"]
    batch = decode_batch(msgspec.msgpack.encode([1.0, [stored, removed], 0, "new batch field"]))
    assert batch.skipped == 0 and len(batch.events) == 2
    mapped = {"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU", "locality": "remote"}
    assert _one(msgspec.msgpack.encode({"ts": 1.0, "events": [mapped], "extra": 1})).block_hashes == [9]


def test_array_batch_with_map_encoded_events() -> None:
    mapped = msgspec.msgpack.decode(msgspec.msgpack.encode(MAP.BlockRemoved([5], "GPU")))
    assert isinstance(mapped, dict) and mapped["type"] == "BlockRemoved"
    assert _one(msgspec.msgpack.encode([1.0, [mapped], 0])).block_hashes == [5]


def test_a_malformed_event_is_skipped_and_counted_and_the_rest_survive() -> None:
    good = ["BlockRemoved", [1], "GPU"]
    bad = [
        ["BlockStored", "not a list", None, [], 16],
        ["BlockStored", [1], None, [1, "x"], 16],
        ["BlockStored", [1], None, [1], 0],
        ["BlockStored", [b""], None, [], 16],
        ["NoSuchEvent", 1],
        {"block_hashes": [1]},
        42,
    ]
    batch = decode_batch(msgspec.msgpack.encode([1.0, [good, *bad, good]]))
    assert len(batch.events) == 2 and batch.skipped == len(bad)


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\x92\xa1x\x90", msgspec.msgpack.encode("batch"), msgspec.msgpack.encode([1.0]), b"\x91" * 5000],
)
def test_a_payload_that_is_not_a_batch_raises_malformed_batch(payload: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_batch(payload)


def test_engine_keys_read_bytes_by_their_last_eight_and_ints_as_unsigned() -> None:
    assert engine_key(b"\x00" * 24 + (5).to_bytes(8, "big")) == 5
    assert engine_key(-1) == 2**64 - 1
    assert engine_key(b"\x01") == 1


# -- fuzz ---------------------------------------------------------------------------------------------------------

_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.binary(max_size=40)
_leaf = _leaf | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "GPU", "CPU"])
_value = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=12)
        | st.dictionaries(st.sampled_from([*BlockStored.__struct_fields__, "type", "ts", "events"]), inner, max_size=8)
    ),
    max_leaves=25,
)


def _event_like() -> st.SearchStrategy[Any]:
    tokens = st.lists(st.integers(-5, 2**20), max_size=48)
    hashes = st.lists(st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=33), max_size=4)
    size = st.sampled_from([0, 1, 8, 16, 32, -16])
    stored = st.tuples(st.just("BlockStored"), hashes, st.none() | st.integers(0, 9), tokens, size).map(list)
    removed = st.tuples(st.just("BlockRemoved"), hashes).map(list)
    return stored | removed | st.just(["AllBlocksCleared"]) | _value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ts=_value, events=st.lists(_event_like(), max_size=8), rank=_value)
def test_a_fuzzed_batch_never_crashes_the_decoder_or_the_index(ts: Any, events: list[Any], rank: Any) -> None:
    payload = msgspec.msgpack.encode([ts, events, rank])
    _decode_and_index(payload)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_decoder(data: bytes) -> None:
    _decode_and_index(data)


@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6))
def test_a_corrupted_real_batch_never_crashes_the_decoder(flips: list[tuple[int, int]]) -> None:
    payload = bytearray(_encode(ARRAY, [ARRAY.BlockStored(SHA[:2], None, TOKENS, 16, None, "GPU", None)]))
    for at, value in flips:
        payload[at % len(payload)] = value
    _decode_and_index(bytes(payload))


def _decode_and_index(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except MalformedBatch:
        return
    assert isinstance(batch, Batch)
    _FUZZED.apply("127.0.0.1:8000", batch, 0.0)  # one index for all examples: no state may crash it either
    _FUZZED.match(_FUZZED.request_keys(TOKENS))


_FUZZED = KvBlockIndex(block_size=8, max_blocks_per_endpoint=64)
