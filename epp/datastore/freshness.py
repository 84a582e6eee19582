"""When an endpoint's scraped data is usable: scraped recently enough and not failing. One rule, one set of thresholds.

Every consumer applies this rule with the same `Freshness` (built once from `--metrics-staleness-threshold` and
`--metrics-max-failures`): the scorers (unusable data counts as unknown: the neutral score), the saturation filter
(drops such endpoints) and detector (counts them full), federation overflow (no capacity there) and `/debug/pool`
(its `usable` field). An endpoint never scraped has NaN `scraped_at`, which compares False: not usable.

Pure: `now` is an argument (seconds on the same monotonic clock as `scraped_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from epp.datastore.table import BoolArray, FloatArray, IntArray, Snapshot

DEFAULT_STALENESS_S = 2.0  # upstream's --metrics-staleness-threshold
DEFAULT_MAX_FAILURES = 3  # upstream's --metrics-max-failures


@dataclass(frozen=True, slots=True)
class Freshness:
    """The thresholds of `usable`: data older than `staleness_s`, or `max_failures` failed scrapes in a row
    (the old values stay in the table while they age), is not used for decisions."""

    staleness_s: float = DEFAULT_STALENESS_S
    max_failures: int = DEFAULT_MAX_FAILURES

    def __post_init__(self) -> None:
        if not self.staleness_s > 0 or self.max_failures < 1:
            raise ValueError("the staleness threshold must be positive and max failures at least 1")


@overload
def usable(scraped_at: float, scrape_failures: float, now: float, freshness: Freshness) -> bool: ...
@overload
def usable(scraped_at: FloatArray, scrape_failures: IntArray, now: float, freshness: Freshness) -> BoolArray: ...
def usable(scraped_at: object, scrape_failures: object, now: float, freshness: Freshness) -> object:
    """Fresh (scraped at or after `now − staleness_s`; never scraped is NaN, not fresh) and fewer than
    `max_failures` failed scrapes in a row. Elementwise on columns; on scalars too, where it is exact for a set of
    endpoints given its oldest `scraped_at` (NaN if any is NaN) and its longest failure streak: the rule is
    monotone in both."""
    return (scraped_at >= now - freshness.staleness_s) & (scrape_failures < freshness.max_failures)  # type: ignore[operator]


def usable_slots(snapshot: Snapshot, now: float, freshness: Freshness) -> BoolArray:
    """`usable` for every slot of a snapshot (False for free slots: they are never scraped)."""
    return usable(snapshot.scraped_at, snapshot.scrape_failures, now, freshness)
