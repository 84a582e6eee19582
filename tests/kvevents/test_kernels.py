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
