import math

import numpy as np
import pytest

from epp.datastore import EndpointInfo, EndpointTable, Freshness, MetricsSample, usable, usable_slots


def _info(n: int) -> EndpointInfo:
    return EndpointInfo(address=f"127.10.0.{n}:8000")


def test_slots_are_stable_and_reused_after_removal() -> None:
    table = EndpointTable(initial_capacity=2)
    a, b, c = (table.upsert(_info(i)) for i in (1, 2, 3))
    assert (a, b, c) == (0, 1, 2)
    assert table.remove("127.10.0.2:8000")
    assert table.upsert(_info(4)) == b
    assert table.slot_of("127.10.0.3:8000") == c


def test_unknown_signals_are_nan_not_zero() -> None:
    table = EndpointTable()
    slot = table.upsert(_info(1))
    table.record_scrape(slot, MetricsSample(waiting=3.0), now=10.0)
    snap = table.snapshot()
    assert snap.waiting[slot] == 3.0
    assert math.isnan(snap.kv_usage[slot])


def test_snapshot_is_a_copy_that_later_writes_do_not_change() -> None:
    table = EndpointTable()
    slot = table.upsert(_info(1))
    table.record_scrape(slot, MetricsSample(waiting=1.0), now=1.0)
    snap = table.snapshot()
    table.record_scrape(slot, MetricsSample(waiting=9.0), now=2.0)
    assert snap.waiting[slot] == 1.0


def test_view_shows_live_values_and_refuses_writes() -> None:
    table = EndpointTable()
    slot = table.upsert(_info(1))
    view = table.view()
    table.record_scrape(slot, MetricsSample(waiting=4.0), now=1.0)
    table.book_pick(slot)
    assert table.view() is view  # same membership: the cached object, no copy
    assert view.waiting[slot] == 4.0 and view.inflight[slot] == 1
    for column in (view.waiting, view.inflight, view.present, view.slots):
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 0
    table.record_scrape(slot, MetricsSample(waiting=5.0), now=2.0)  # the table itself stays writable
    assert view.waiting[slot] == 5.0


def test_view_is_rebuilt_when_membership_adapters_or_capacity_change() -> None:
    table = EndpointTable(initial_capacity=1)
    first = table.upsert(_info(1))
    view = table.view()
    second = table.upsert(_info(2))  # grows the blocks: the old views would point at the old arrays
    grown = table.view()
    assert grown is not view and grown.slots.tolist() == [first, second]
    table.record_scrape(second, MetricsSample(waiting=2.0, running_adapters=("a",)), now=1.0)
    with_adapters = table.view()
    assert with_adapters is not grown and with_adapters.running_adapters[second] == frozenset({"a"})
    table.remove("127.10.0.1:8000")
    assert table.view().slots.tolist() == [second]


def test_replace_all_reconciles_additions_and_removals() -> None:
    table = EndpointTable()
    table.replace_all([_info(1), _info(2)])
    added, removed = table.replace_all([_info(2), _info(3)])
    assert (added, removed) == (1, 1)
    assert sorted(table.addresses()) == ["127.10.0.2:8000", "127.10.0.3:8000"]
    assert list(table.snapshot().slots) == sorted(table.slot_of(a) for a in table.addresses())  # type: ignore[type-var]


def test_usable_excludes_never_scraped_old_and_failing_rows() -> None:
    table = EndpointTable()
    fresh, old, _never, failing, bound = (table.upsert(_info(i)) for i in range(5))
    table.record_scrape(fresh, MetricsSample(), now=100.0)
    table.record_scrape(old, MetricsSample(), now=99.0)
    table.record_scrape(failing, MetricsSample(), now=100.0)
    table.record_scrape(bound, MetricsSample(), now=99.75)  # exactly at the threshold: still fresh
    for _ in range(3):
        table.record_scrape_failure(failing)
    table.record_scrape_failure(fresh)  # fewer failures than the limit: still usable
    freshness = Freshness(staleness_s=0.25, max_failures=3)
    assert list(np.flatnonzero(usable_slots(table.snapshot(), 100.0, freshness))) == [fresh, bound]


def test_usable_on_extremes_answers_for_the_whole_set() -> None:
    """The rule is monotone: the oldest scrape and the longest failure streak decide for every endpoint at once."""
    freshness = Freshness(staleness_s=2.0, max_failures=3)
    assert usable(98.0, 2, 100.0, freshness) and not usable(97.9, 0, 100.0, freshness)
    assert not usable(100.0, 3, 100.0, freshness) and not usable(math.nan, 0, 100.0, freshness)


def test_inflight_bookings_are_released_and_never_negative() -> None:
    table = EndpointTable()
    slot = table.upsert(_info(1))
    table.book_pick(slot)
    table.release_pick(slot)
    table.release_pick(slot)
    assert table.snapshot().inflight[slot] == 0


def test_scrape_version_moves_with_every_recorded_scrape_or_failure_only() -> None:
    table = EndpointTable()
    slot = table.upsert(_info(1))
    seen = table.scrape_version
    table.book_pick(slot)
    table.release_pick(slot)
    assert table.scrape_version == seen  # the picker's own bookkeeping is not a scrape
    table.record_scrape(slot, MetricsSample(waiting=1.0), now=1.0)
    table.record_scrape_failure(slot)
    table.write_scrape_rows(np.array([slot]), np.full((1, 7), 2.0), np.array([True]), np.array([0]))
    assert table.scrape_version == seen + 3


def test_a_stamp_dates_a_scraped_row_and_restarts_its_picks_when_the_table_is_read() -> None:
    from epp.datastore.rows import write_stamps

    t = EndpointTable()
    a, b = t.upsert(EndpointInfo("127.0.0.1:1")), t.upsert(EndpointInfo("127.0.0.1:2"))
    t.record_scrape(a, MetricsSample(waiting=3), now=10.0)
    t.book_pick(a)
    stamps = np.zeros(8)  # by the writer's slot: ours are 5 and 6 there
    t.follow_stamps(stamps, np.array([a, b]), np.array([5, 6]))
    write_stamps(stamps, np.array([5, 6]), np.array([12.0, 12.0]))
    assert t.column("scraped_at")[a] == 10.0  # nothing happens until the table is read
    view = t.view()
    assert view.scraped_at[a] == 12.0 and view.waiting[a] == 3.0  # dated anew, same values
    assert view.picks_since_scrape[a] == 0  # as a fresh page would
    assert math.isnan(view.scraped_at[b])  # never scraped: a stamp vouches for no values
    write_stamps(stamps, np.array([5]), np.array([11.0]))  # older than the row's page: ignored
    assert t.snapshot().scraped_at[a] == 12.0


def test_a_repeated_page_moves_only_the_time_and_is_told_apart_from_a_new_record() -> None:
    t = EndpointTable()
    a, b = t.upsert(EndpointInfo("a:1")), t.upsert(EndpointInfo("b:1"))
    assert not t.record_repeat(a, 1.0)  # never scraped: the row holds no page to repeat
    t.record_scrape(a, MetricsSample(waiting=3), 1.0)
    t.record_scrape(b, MetricsSample(waiting=4), 1.0)
    t.book_pick(a)
    assert sorted(t.take_scraped()[0]) == [a, b] and t.take_scraped() == ([], [])
    version = t.scrape_version
    assert t.record_repeat(a, 2.0)
    snap = t.snapshot()
    assert (snap.waiting[a], snap.scraped_at[a], snap.picks_since_scrape[a]) == (3.0, 2.0, 0)
    assert t.scrape_version == version + 1
    t.record_repeat(b, 2.0)
    t.record_scrape(b, MetricsSample(waiting=5), 2.5)  # a new record wins over a repeat in the same pass
    assert t.take_scraped() == ([b], [a])
    t.record_scrape_failure(a)
    assert not t.record_repeat(a, 3.0)  # a failure since: the row is not that page's any more
    assert t.snapshot().scraped_at[a] == 2.0
    t.remove("b:1")
    b = t.upsert(EndpointInfo("b:1"))
    assert not t.record_repeat(b, 3.0)  # a reset row
    values, ok, failures = t.scrape_rows(np.array([a]))
    assert values.shape == (1, 7) and values[0, 0] == 3.0 and not ok[0] and failures[0] == 1
