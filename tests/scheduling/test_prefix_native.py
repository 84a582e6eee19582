"""The compiled prefix-index match (epp/scheduling/_native.c) equals its definition (`PrefixIndex.match_python`):
the same blocks matched per slot and the same reach, on indexes built by picks and on arbitrary holder sets."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling import totals
from epp.scheduling.prefix import PrefixIndex

needs_native = pytest.mark.skipif(totals.NATIVE is None, reason="the C extension is not built (or EPP_NATIVE=0)")


def _both(index: PrefixIndex, hashes: list[int], size: int) -> None:
    expected = index.match_python(hashes, size)
    reach = index.reach
    got = index.match(hashes, size)
    assert got.tolist() == expected.tolist()
    assert index.reach == reach


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 70), st.integers(0, 12), st.integers(1, 20)), max_size=30),
    st.integers(0, 12),
    st.integers(1, 80),
    st.integers(2, 40),
)
def test_the_compiled_match_is_the_definition_on_picked_prefixes(picks, asked, size, capacity) -> None:
    """Prompts are prefixes of one chain (and of a second one from block 3 on); each pick adds one to a slot."""
    chain = [1000 + i for i in range(20)]
    other = chain[:3] + [5000 + i for i in range(17)]
    index = PrefixIndex(capacity)
    for slot, start, length in picks:
        hashes = (chain if start % 2 else other)[:length]
        index.add(slot, f"10.0.0.{slot}:8000", hashes, 0, capacity, None)
    for hashes in (chain[:asked], other[:asked], [], [7, 8]):
        _both(index, hashes, size)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.integers(0, 15), st.integers(0, 2**70), max_size=16),
    st.lists(st.integers(0, 15), max_size=16),
    st.integers(0, 90),
)
def test_the_compiled_match_is_the_definition_on_any_holders(holders, hashes, size) -> None:
    """Holder sets outside the index's invariant (not shrinking with depth, wider than 64 bits, beyond the size)."""
    index = PrefixIndex(8)
    index._holders = holders
    _both(index, hashes, size)


@needs_native
def test_a_holder_set_wider_than_64_slots_runs_the_definition() -> None:
    index = PrefixIndex(8)
    index._holders = {1: 1 << 70 | 1}
    assert totals.NATIVE is not None
    assert totals.NATIVE.prefix_match(index._holders, [1], np.zeros(80)) is NotImplemented
    assert index.match([1], 80)[[0, 70]].tolist() == [1.0, 1.0]


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 40)), st.lists(st.integers(0, 40), max_size=12))
def test_the_compiled_young_subset_test_is_issuperset(young: set[int], hashes: list[int]) -> None:
    """`PrefixIndex.holds_young`'s subset test, compiled, is `young.issuperset(hashes)` (duplicates, empty lists)."""
    assert totals.NATIVE is not None
    assert totals.NATIVE.holds_all(young, hashes) is young.issuperset(hashes)
