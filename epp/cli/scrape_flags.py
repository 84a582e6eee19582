"""The scrape flags of `epp serve` (upstream's names and defaults) and the settings they make."""

from __future__ import annotations

import argparse
import re
from typing import Any

from epp.scrape.scraper import ScrapeSettings

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds from a Go duration ("50ms", "1s", "1m30s", "1.5s") or plain seconds ("0.05")."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        pos, value = 0, 0.0
        for m in _PART.finditer(t):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(t) or not t:
            raise argparse.ArgumentTypeError(f"not a duration (e.g. 50ms, 1s, 0.05): {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return value


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
        type=parse_duration,
        default=d.interval_s,
        help="how often each endpoint's /metrics is scraped, e.g. 50ms, 1s (default 50ms)",
    )
    g.add_argument(
        "--metrics-staleness-threshold",
        type=parse_duration,
        default=d.staleness_s,
        help="metrics older than this mark an endpoint stale: unknown to scorers, saturated to admission (default 2s)",
    )
    g.add_argument(
        "--metrics-scrape-timeout",
        type=parse_duration,
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
    return ScrapeSettings(
        interval_s=args.refresh_metrics_interval,
        timeout_s=args.metrics_scrape_timeout,
        staleness_s=args.metrics_staleness_threshold,
        max_failures=args.metrics_max_failures,
        max_page_bytes=args.metrics_max_page_bytes,
        concurrency=args.metrics_scrape_concurrency,
    )
