"""The scrape flags of `epp serve`: Go-style durations, upstream defaults, one-line errors."""

from __future__ import annotations

import argparse

import pytest

from epp.cli import build_parser
from epp.cli.flag_types import duration, positive_duration
from epp.cli.scrape_flags import scrape_settings_from_args


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("50ms", 0.05), ("1s", 1.0), ("1m30s", 90.0), ("1.5s", 1.5), ("0.05", 0.05), ("2", 2.0), ("250us", 0.00025)],
    ids=["ms", "s", "m-s", "fraction", "plain-fraction", "plain-int", "us"],
)
def test_durations(text: str, seconds: float) -> None:
    assert positive_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "5 ms", "-1s", "0", "1d", "ms", "-1"], ids=str)
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        positive_duration(text)


def test_zero_is_a_duration_where_it_means_at_once() -> None:
    assert duration("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match="negative"):
        duration("-1")


def test_defaults_follow_upstream() -> None:
    args = build_parser().parse_args(["serve"])
    s = scrape_settings_from_args(args)
    assert (s.interval_s, s.staleness_s, s.timeout_s) == (0.05, 2.0, 1.0)


def test_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--refresh-metrics-interval",
            "100ms",
            "--metrics-staleness-threshold",
            "200ms",
            "--metrics-max-failures",
            "5",
        ]
    )
    s = scrape_settings_from_args(args)
    assert (s.interval_s, s.staleness_s, s.max_failures) == (0.1, 0.2, 5)


def test_a_bad_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--refresh-metrics-interval", "soon"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_freshness_flags_reach_every_decision() -> None:
    """--metrics-staleness-threshold and --metrics-max-failures are the pool's one rule for usable data: the
    scorers', the saturation filter's and the detector's (as `epp serve` builds the scheduler)."""
    from epp.datastore import Freshness
    from epp.scheduling import build_scheduler

    args = build_parser().parse_args(["serve", "--metrics-staleness-threshold", "3s", "--metrics-max-failures", "7"])
    scheduler = build_scheduler(None, freshness=scrape_settings_from_args(args).freshness)
    assert scheduler.freshness == scheduler.saturation.freshness == Freshness(staleness_s=3.0, max_failures=7)
