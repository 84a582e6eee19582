"""The scrape flags of `epp serve` (upstream's names and defaults) and the settings they make."""

from __future__ import annotations

import argparse
from typing import Any

from epp.cli.flag_types import positive_duration
from epp.scrape.scraper import ScrapeSettings


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def add_scrape_flags(p: Any) -> None:
    d = ScrapeSettings()
    g = p.add_argument_group("model-server metrics")
    g.add_argument(
        "--refresh-metrics-interval",
        type=positive_duration,
        default=d.interval_s,
        help="how often each endpoint's /metrics is scraped, e.g. 50ms, 1s (default 50ms)",
    )
    g.add_argument(
        "--metrics-staleness-threshold",
        type=positive_duration,
        default=d.staleness_s,
        help="metrics older than this mark an endpoint stale: unknown to scorers, saturated to admission (default 2s)",
    )
    g.add_argument(
        "--metrics-scrape-timeout",
        type=positive_duration,
        default=d.timeout_s,
        help="time limit of one scrape (default 1s)",
    )
    g.add_argument(
        "--metrics-max-failures",
        type=_positive_int,
        default=d.max_failures,
        help="failed scrapes in a row that mark an endpoint stale (default 3)",
    )
    g.add_argument(
        "--metrics-max-page-bytes",
        type=_positive_int,
        default=d.max_page_bytes,
        help="larger metrics pages fail the scrape (default 8 MiB)",
    )
    g.add_argument(
        "--metrics-scrape-concurrency",
        type=_positive_int,
        default=d.concurrency,
        help="scrapes in flight at once, all endpoints together (default 512)",
    )
    g.add_argument(
        "--metrics-scrape-in-process",
        action="store_true",
        help="scrape on the picker's own event loop instead of a child process (costs serving CPU; see "
        "benchmarks/RESULTS.md)",
    )


def scrape_settings_from_args(args: argparse.Namespace) -> ScrapeSettings:
    """The one place the scrape flags become settings: the scraper reads them, and so do `/debug/pool`'s health
    columns and whatever else judges an endpoint by its scrapes (staleness, failures in a row)."""
    return ScrapeSettings(
        interval_s=args.refresh_metrics_interval,
        timeout_s=args.metrics_scrape_timeout,
        staleness_s=args.metrics_staleness_threshold,
        max_failures=args.metrics_max_failures,
        max_page_bytes=args.metrics_max_page_bytes,
        concurrency=args.metrics_scrape_concurrency,
    )
