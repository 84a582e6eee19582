"""The workloads' working set: distinct prefix blocks, and the part of them that recurs."""

from __future__ import annotations

from benchmarks.workloads import Item, shared_prefix, working_set


def test_working_set_counts_distinct_prefix_chains_and_those_that_recur() -> None:
    items = [Item(0.0, 2048, 1, (1, 2, 3)), Item(1.0, 2048, 1, (1, 2, 4)), Item(2.0, 1024, 1, (9, 2))]
    assert working_set(items) == (6, 2)  # chains 1, 1-2, 1-2-3, 1-2-4, 9, 9-2; 1 and 1-2 recur (9-2 != 1-2)


def test_shared_prefix_working_set_is_every_customers_context() -> None:
    distinct, recurring = working_set(shared_prefix(4000))
    assert distinct == 256 * 8192 // 512 and recurring == distinct
