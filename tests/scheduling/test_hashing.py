import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.kvevents import kernels
from epp.scheduling.hashing import BlockHasher


def test_only_whole_blocks_are_hashed_and_capped() -> None:
    hasher = BlockHasher(64, max_blocks=4)
    assert hasher.hash_prompt("x" * 63, "m").size == 0
    assert hasher.hash_prompt("x" * 130, "m").size == 2
    assert hasher.hash_prompt("x" * 10_000, "m").size == 4


def test_model_name_seeds_the_chain() -> None:
    hasher = BlockHasher(64, 16)
    a = hasher.hash_prompt("p" * 256, "llama")
    b = hasher.hash_prompt("p" * 256, "mistral")
    assert not np.intersect1d(a, b).size


def test_hashes_are_stable_across_instances() -> None:
    # Two replicas (or two benchmark runs) must agree on every key: no per-process salt.
    assert (
        BlockHasher(64, 8).hash_prompt("q" * 512, "m").tolist()
        == BlockHasher(64, 8).hash_prompt("q" * 512, "m").tolist()
    )


def test_non_ascii_and_lone_surrogates_do_not_fail() -> None:
    assert BlockHasher(8, 64).hash_prompt("é€😀\ud800" * 20, "m").size > 0


@given(st.text(min_size=128, max_size=600), st.text(min_size=1, max_size=200))
def test_a_shared_prefix_gives_shared_leading_hashes(prefix, tail) -> None:
    hasher = BlockHasher(16, 64)
    a = hasher.hash_prompt(prefix + tail, "m")
    b = hasher.hash_prompt(prefix, "m")
    common = b.size  # every whole block of `prefix` is also a whole block of `prefix + tail`
    assert a[:common].tolist() == b.tolist()


@given(st.text(alphabet="abcdefgh", min_size=64, max_size=64), st.integers(0, 63))
def test_changing_one_byte_changes_that_block_and_every_later_one(text, position) -> None:
    hasher = BlockHasher(8, 8)
    changed = text[:position] + ("x" if text[position] != "x" else "y") + text[position + 1 :]
    a, b = hasher.hash_prompt(text, "m"), hasher.hash_prompt(changed, "m")
    block = position // 8
    assert a[:block].tolist() == b[:block].tolist()
    assert (a[block:] != b[block:]).all()


def test_absurd_block_settings_are_bounded() -> None:
    hasher = BlockHasher(10**9, max_blocks=10**9)  # e.g. from a garbage cache_config_info
    assert hasher.words * hasher.max_blocks <= 1 << 22


def _numpy_twin(hasher: BlockHasher) -> BlockHasher:
    twin = BlockHasher(hasher.block_bytes, hasher.max_blocks)
    twin._native = None  # the numpy definition
    return twin


@pytest.mark.skipif(kernels.NATIVE is None, reason="the compiled kernels are switched off")
@settings(max_examples=200)
@given(
    block_bytes=st.integers(1, 300),
    max_blocks=st.integers(1, 40),
    data=st.binary(max_size=4096),
    model=st.text(max_size=20),
)
def test_compiled_block_hashes_equal_the_numpy_definition(
    block_bytes: int, max_blocks: int, data: bytes, model: str
) -> None:
    hasher = BlockHasher(block_bytes, max_blocks)
    assert hasher._native is kernels.NATIVE
    compiled = hasher.hash_bytes(data, model)
    defined = _numpy_twin(hasher).hash_bytes(data, model)
    assert compiled.dtype == defined.dtype == np.uint64
    assert compiled.tolist() == defined.tolist()


@pytest.mark.skipif(kernels.NATIVE is None, reason="the compiled kernels are switched off")
def test_compiled_block_hashes_of_a_long_prompt_at_the_default_cap() -> None:
    hasher = BlockHasher(64, 256)
    prompt = "".join(chr(32 + (i * 7919) % 9000) for i in range(40_000))  # multi-byte characters, past the cap
    compiled = hasher.hash_prompt(prompt, "llama")
    assert compiled.size == 256
    assert compiled.tolist() == _numpy_twin(hasher).hash_prompt(prompt, "llama").tolist()


@pytest.mark.skipif(kernels.NATIVE is None, reason="the compiled kernels are switched off")
@settings(max_examples=200)
@given(
    block_bytes=st.integers(1, 300),
    max_blocks=st.integers(1, 40),
    prompt=st.text(max_size=2048),
    model=st.text(max_size=20),
)
def test_the_compiled_hash_list_is_the_numpy_definitions_list(
    block_bytes: int, max_blocks: int, prompt: str, model: str
) -> None:
    hasher = BlockHasher(block_bytes, max_blocks)
    listed = hasher.hash_list(prompt, model)
    assert listed == _numpy_twin(hasher).hash_prompt(prompt, model).tolist()
    assert all(type(h) is int for h in listed)
    assert _numpy_twin(hasher).hash_list(prompt, model) == listed  # the uncompiled path answers the same list


def test_a_long_prompt_hash_list_at_the_default_cap() -> None:
    hasher = BlockHasher(64, 256)
    prompt = "".join(chr(32 + (i * 7919) % 9000) for i in range(40_000))
    assert hasher.hash_list(prompt, "llama") == _numpy_twin(hasher).hash_prompt(prompt, "llama").tolist()
