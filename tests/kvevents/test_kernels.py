"""The compiled kernels answer exactly what the numpy definitions answer, and the dev install has them."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.kvevents import kernels
from epp.kvevents.blockkeys import BlockKeys
from epp.kvevents.shared import BUCKET, SharedBlockTable, table_bytes
from epp.kvevents.token_ids import TokenIds
from tests.conftest import ROOT

needs_native = pytest.mark.skipif(kernels.NATIVE is None, reason="the compiled kernels are switched off")


def test_the_dev_install_has_the_compiled_kernels_and_runs_them() -> None:
    """`make install` builds the extension in place; CI must not fall back to numpy without anyone noticing."""
    assert kernels.compiled(), "epp/kvevents/_native.c was not built: run `make install` (needs gcc, Python.h)"
    if os.environ.get("EPP_NATIVE") != "0":
        assert kernels.NATIVE is not None and kernels.name() == "native"
        assert BlockKeys()._native is kernels.NATIVE


@pytest.mark.process
def test_epp_native_0_switches_the_kernels_off_at_import() -> None:
    code = "from epp.kvevents import kernels, blockkeys; print(kernels.name(), blockkeys.BlockKeys()._native)"
    env = {**os.environ, "EPP_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["numpy", "None"]


def _both(keys: BlockKeys) -> tuple[BlockKeys, BlockKeys]:
    numpy_keys = BlockKeys.__new__(BlockKeys)
    numpy_keys.__dict__.update(keys.__dict__)
    numpy_keys._native = None
    return keys, numpy_keys


def _forms(ids: list[int]) -> list[object]:
    """The inputs `request_keys` takes: a list, uint64 arrays (contiguous or not), and below 2^32 the render
    client's uint32 buffer and uint32 / int64 arrays."""
    out: list[object] = [ids, np.array(ids, dtype=np.uint64), np.repeat(np.array(ids, dtype=np.uint64), 2)[::2]]
    if all(t < 1 << 32 for t in ids):
        out += [TokenIds.of(ids), np.array(ids, dtype=np.uint32), np.array(ids, dtype=np.int64)]
        out.append(np.frombuffer(TokenIds.of(ids).data, dtype="<u4"))  # what the producer hands over
    return out


@needs_native
@settings(max_examples=150)
@given(
    block_size=st.sampled_from([1, 2, 3, 7, 16, 64]),
    max_blocks=st.integers(1, 12),
    wide=st.booleans(),
    extra=st.integers(0, 80),
    seed=st.text(max_size=3),
    lora=st.none() | st.text(max_size=3),
    data=st.data(),
)
def test_native_request_keys_equal_the_numpy_closed_form(
    block_size: int, max_blocks: int, wide: bool, extra: int, seed: str, lora: str | None, data: st.DataObject
) -> None:
    """uint32 and uint64 ids (up to 2^64 − 1), partial trailing blocks, prompts past the `max_blocks` cap."""
    top = (1 << 64) - 1 if wide else (1 << 32) - 1
    n = data.draw(st.integers(0, block_size * max_blocks + extra))
    ids = data.draw(st.lists(st.integers(0, top) | st.sampled_from([0, top, top - 1]), min_size=n, max_size=n))
    native, numpy_keys = _both(BlockKeys(block_size, seed, max_blocks))
    want = numpy_keys.request_keys(ids, lora)
    assert len(want) == min(n // block_size, max_blocks)
    for form in _forms(ids):
        got = native.request_keys(form, lora)  # type: ignore[arg-type]
        assert got.dtype == np.uint64 and got.tolist() == want.tolist(), type(form)
    assert (
        want.tolist()
        == BlockKeys.chain(numpy_keys.root(lora), numpy_keys.block_values(np.array(ids, np.uint64)))[:max_blocks]
    )


@needs_native
def test_native_request_keys_of_a_long_prompt_at_the_default_cap() -> None:
    rng = random.Random(4)
    ids = [rng.randrange(1 << 32) for _ in range(16 * 8192 + 100)]
    native, numpy_keys = _both(BlockKeys())
    want = numpy_keys.request_keys(ids)
    assert len(want) == 8192
    assert native.request_keys(TokenIds.of(ids)).tolist() == want.tolist()
    assert native.request_keys(np.array(ids, dtype=np.uint64)).tolist() == want.tolist()


@needs_native
def test_native_request_keys_refuse_what_numpy_refuses() -> None:
    native, numpy_keys = _both(BlockKeys(2))
    for bad, error in (([1, -1], OverflowError), ([1, 1 << 64], OverflowError), ([1, "x"], TypeError)):
        for keys in (native, numpy_keys):
            with pytest.raises(error):
                keys.request_keys(bad)  # type: ignore[arg-type]


def _table(capacity: int, words: int, entries: list[tuple[int, int]]) -> SharedBlockTable:
    table = SharedBlockTable(bytearray(table_bytes(capacity, words)), capacity, words, create=True)
    for key, mask in entries:
        table.set(key, mask)  # False past the table's room: that key is left out, as a writer before its rebuild
    return table


def _prefix_both(table: SharedBlockTable, keys: np.ndarray) -> tuple[list[int], list[int]]:
    assert table._native is not None
    got = table.prefix_blocks(keys).tolist()
    native, table._native = table._native, None
    try:
        want = table.prefix_blocks(keys).tolist()
    finally:
        table._native = native
    return got, want


def _key(top: int, bits: int, low: int) -> int:
    """An odd key whose top `bits` bits are `top` (so its home bucket is chosen)."""
    return ((top << (64 - bits)) | (low << 1) | 1) & ((1 << 64) - 1)


@needs_native
@settings(max_examples=200)
@given(
    capacity=st.sampled_from([16, 32, 64, 64, 256]),
    words=st.integers(1, 3),
    data=st.data(),
)
def test_native_table_lookup_equals_the_numpy_reader(capacity: int, words: int, data: st.DataObject) -> None:
    """Random keys and masks over 1–3 words; keys crowded into a few buckets (full buckets, keys past them and
    wrapping to the first), keys next to 2^64, masks rewritten and cleared, absent keys mid-prompt."""
    bits = (capacity // BUCKET).bit_length() - 1
    last = (1 << bits) - 1
    key = st.builds(_key, st.integers(0, last), st.just(bits), st.integers(0, 1 << 40)) | st.sampled_from(
        [(1 << 64) - 1, (1 << 64) - 3, 1, 3]
    )
    # up to 24 keys with the same home bucket (the last one sometimes: keys past it wrap to the first)
    crowd = data.draw(st.sampled_from([0, last]) | st.integers(0, last))
    crowded = data.draw(st.sampled_from([17, 20, 24]) | st.integers(0, 24))
    lows = data.draw(st.lists(st.integers(0, 1 << 20), min_size=crowded, max_size=crowded, unique=True))
    stored = list(dict.fromkeys([_key(crowd, bits, low) for low in lows] + data.draw(st.lists(key, max_size=24))))
    stored = data.draw(st.permutations(stored))
    mask = st.integers(0, (1 << (64 * words)) - 1) | st.sampled_from([0, (1 << (64 * words)) - 1, 1 << 63])
    entries = [(k, data.draw(mask)) for k in stored]
    entries += (
        [(k, data.draw(mask)) for k in data.draw(st.lists(st.sampled_from(stored), max_size=6))] if stored else []
    )
    table = _table(capacity, words, entries)
    absent = data.draw(st.lists(key.filter(lambda k: k not in stored), max_size=2))
    if data.draw(st.booleans()) or not stored:  # any keys in any order
        prompt = data.draw(st.lists(st.sampled_from(stored + absent) if stored or absent else key, max_size=40))
    else:  # the stored keys in order (runs through full buckets), an absent key somewhere or nowhere
        prompt = stored[: data.draw(st.just(len(stored)) | st.integers(1, len(stored)))]
        if absent:
            prompt.insert(data.draw(st.integers(0, len(prompt))), absent[0])
    got, want = _prefix_both(table, np.array(prompt, dtype=np.uint64))
    assert len(got) == 64 * words
    assert got == want


@needs_native
def test_native_table_lookup_of_a_long_prompt_whose_holders_drop_one_by_one() -> None:
    """More rows than a byte counts (the numpy reader's lanes), every endpoint's prefix ending at its own row."""
    rng = random.Random(8)
    keys = [rng.getrandbits(64) | 1 for _ in range(1200)]
    full = (1 << 130) - 1
    entries = [(k, full >> (i // 10)) for i, k in enumerate(keys)]  # one endpoint fewer every 10 rows
    table = _table(1 << 12, 3, entries)
    got, want = _prefix_both(table, np.array(keys, dtype=np.uint64))
    assert got == want and max(got) == 1200 and sorted(set(got))[:3] == [0, 10, 20]
    got, want = _prefix_both(table, np.array(keys[:0], dtype=np.uint64))
    assert got == want == [0] * 192


@needs_native
@pytest.mark.parametrize("home", [0, 3])
def test_native_table_lookup_follows_keys_past_a_full_bucket_and_wraps(home: int) -> None:
    """24 keys with one home bucket of a 4-bucket table: 8 go past it (from the last bucket: to the first)."""
    keys = [_key(home, 2, low) for low in range(24)]
    table = _table(64, 1, [(k, 0b11 if i < 20 else 0b01) for i, k in enumerate(keys)])
    got, want = _prefix_both(table, np.array(keys, dtype=np.uint64))
    assert got == want and got[:3] == [24, 20, 0]
    absent = _key(home, 2, 99)
    got, want = _prefix_both(table, np.array([*keys[:18], absent, *keys[18:]], dtype=np.uint64))
    assert got == want and got[:2] == [18, 18]
