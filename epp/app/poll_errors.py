"""Failed scrapes by reason, summed over endpoints, monotonic although endpoints come and go."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from epp.scrape.scraper import EndpointStatus


class PollErrorTotals:
    """Totals from the scrape service's per-endpoint statuses; a removed endpoint's counts are kept as retired."""

    def __init__(self, statuses: Callable[[], Mapping[str, EndpointStatus]]) -> None:
        self._statuses = statuses
        self._last: dict[str, dict[str, int]] = {}
        self._retired: dict[str, int] = {}

    def __call__(self) -> dict[str, int]:
        current = {address: dict(s.errors_by_reason) for address, s in self._statuses().items()}
        for address, counts in self._last.items():
            if address not in current:
                for reason, n in counts.items():
                    self._retired[reason] = self._retired.get(reason, 0) + n
        self._last = current
        totals = dict(self._retired)
        for counts in current.values():
            for reason, n in counts.items():
                totals[reason] = totals.get(reason, 0) + n
        return totals
