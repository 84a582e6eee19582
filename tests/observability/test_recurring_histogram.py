"""A RecurringHistogram (a PlainHistogram that remembers each value's bucket) counts and sums as PlainHistogram
does, value after value: repeats, NaN, signed zeros, values on the bounds, ints and floats, past its memo's size."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.observability import buckets
from epp.observability.plain import PlainHistogram, RecurringHistogram

values = st.one_of(
    st.sampled_from([math.nan, -0.0, 0.0, 0.1, 0.5, 1.0, 16, 64, 65536, 70000, -1.0, math.inf, -math.inf]),
    st.floats(allow_nan=True),
    st.integers(-10, 100_000),
    st.integers(0, 20).map(lambda k: k / 20),  # a ratio of block counts
)


@settings(max_examples=300)
@given(
    bounds=st.sampled_from([buckets.PREFIX_HIT_RATIO, buckets.PREFIX_HIT_BYTES]),
    observed=st.lists(values, max_size=80),
    memo=st.integers(0, 8),
)
def test_a_recurring_histogram_counts_and_sums_as_a_plain_one(bounds, observed, memo) -> None:
    plain, recurring = PlainHistogram(bounds), RecurringHistogram(bounds, memo)
    for value in observed + observed:  # every value at least twice
        plain.observe(value)
        recurring.observe(value)
        assert recurring.counts == plain.counts
        assert recurring.sum == plain.sum or (math.isnan(recurring.sum) and math.isnan(plain.sum))
