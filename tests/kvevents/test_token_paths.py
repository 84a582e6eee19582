"""One block-key definition on both sides: a request's keys from the render response's bytes (decoded straight into a
uint32 buffer, `TokenIds`, as the serving path does) equal, bit for bit, the keys computed from a Python list and the
keys the feeder's index recomputes from the same tokens arriving as KV events (any split into events, engine
blocks smaller than, equal to or larger than ours), for random token lists."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.director.tokens import RenderError, _token_ids
from epp.kvevents.blockkeys import BlockKeys
from epp.kvevents.decode import BlockStored
from epp.kvevents.index import KvBlockIndex
from epp.kvevents.token_ids import TokenIds
from epp.scheduling.framework import CycleState
from epp.scheduling.producers import TokenProducer, tokenized
from tests.scheduling.tables import request, table_with

TOKEN = st.integers(min_value=0, max_value=(1 << 32) - 1)


def _response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body


def _served_keys(keys: BlockKeys, ids: list[int]) -> list[int]:
    """The serving path: render bytes → TokenIds → token-producer's bytes → the precise producer's uint64 view."""
    parsed = _token_ids(_response(json.dumps({"token_ids": ids, "features": None}).encode()))
    snap = table_with([{}]).snapshot()
    state = CycleState(snap, snap.slots, request("x", token_ids=parsed), 0.0)
    TokenProducer(backend="vllm", model_name="m").produce(state)
    data = tokenized(state).data
    out: list[int] = keys.request_keys(np.frombuffer(data, dtype="<u4").astype(np.uint64)).tolist()
    return out


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(TOKEN, min_size=1, max_size=700),
    ours=st.sampled_from([16, 32, 64]),
    engine=st.sampled_from([8, 16, 32, 64, 128]),
    cuts=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=8),
)
def test_request_keys_from_the_render_bytes_equal_the_list_path_and_the_feeders_keys(
    ids: list[int], ours: int, engine: int, cuts: list[int]
) -> None:
    keys = BlockKeys(ours, max_blocks=64)
    from_list = keys.request_keys(ids).tolist()
    assert _served_keys(keys, ids) == from_list
    assert keys.request_keys(TokenIds.of(ids)).tolist() == from_list

    # the same tokens as KV events, engine blocks chained across events split at `cuts` (in engine blocks)
    index = KvBlockIndex(block_size=ours, max_request_blocks=64)
    whole = len(ids) // engine
    parent, at, n = None, 0, 0
    while at < whole:
        step = min(cuts[n % len(cuts)], whole - at)
        hashes = list(range(at + 1, at + step + 1))
        tokens = ids[at * engine : (at + step) * engine]
        index.apply("127.10.0.1:8000", [BlockStored(hashes, parent, tokens, engine, None, "GPU")], 1.0)
        parent, at, n = hashes[-1], at + step, n + 1
    held = len(from_list) if whole * engine >= len(from_list) * ours else whole * engine // ours
    assert index.match(from_list) == ({"127.10.0.1:8000": held} if held else {})
    assert set(index.holders) == set(
        keys.chain(keys.root(), keys.block_values(keys.tokens_array(ids)))[: whole * engine // ours]
    )


@pytest.mark.parametrize(
    "body",
    [b'{"token_ids": [1, -2]}', b'{"token_ids": [4294967296]}', b'{"token_ids": ["a"]}', b"[1, 2]", b"{}", b"{"],
    ids=["negative", "over-32-bits", "not-int", "not-object", "missing", "not-json"],
)
def test_a_render_answer_without_a_valid_id_list_is_refused(body: bytes) -> None:
    with pytest.raises(RenderError):
        _token_ids(_response(body))


def test_token_ids_compare_count_and_index_as_the_tuple_they_stand_for() -> None:
    ids = TokenIds.of([5, 0, 4294967295])
    assert ids == (5, 0, 4294967295) and len(ids) == 3 and ids[2] == 4294967295 and ids[:2] == (5, 0)
    assert list(ids) == [5, 0, 4294967295] and bool(ids) and not TokenIds.of([])
    assert ids.data == np.array([5, 0, 4294967295], dtype="<u4").tobytes()
    with pytest.raises(OverflowError):
        TokenIds.of([1 << 32])
