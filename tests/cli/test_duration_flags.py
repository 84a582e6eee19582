"""Every flag that takes a duration reads it the same way: Go's grammar, or a bare number of seconds."""

from __future__ import annotations

import pytest

from epp.cli import build_parser

ENVOY = ["envoy-config", "--pool-file", "pool.yaml", "--epp", "127.0.0.1:9002"]
# (command line before the flag, flag, attribute, zero allowed)
DURATION_FLAGS = [
    (["serve"], "--grace-period", "grace_period", True),
    (["serve"], "--refresh-metrics-interval", "refresh_metrics_interval", False),
    (["serve"], "--metrics-staleness-threshold", "metrics_staleness_threshold", False),
    (["serve"], "--metrics-scrape-timeout", "metrics_scrape_timeout", False),
    (["serve"], "--leader-elect-lease-duration", "leader_elect_lease_duration", False),
    (["serve"], "--leader-elect-renew-deadline", "leader_elect_renew_deadline", False),
    (["serve"], "--leader-elect-retry-period", "leader_elect_retry_period", False),
    (["sim"], "--duration", "duration", True),
    (["demo"], "--seconds", "seconds", False),
    (["demo"], "--drain", "drain", True),
    (["inspect-metrics", "page.txt"], "--timeout", "timeout", False),
    (ENVOY, "--message-timeout", "message_timeout", False),
]
IDS = [flag for _, flag, _, _ in DURATION_FLAGS]


@pytest.mark.parametrize(("before", "flag", "attr", "zero_ok"), DURATION_FLAGS, ids=IDS)
@pytest.mark.parametrize(("text", "seconds"), [("10s", 10.0), ("1m30s", 90.0), ("250ms", 0.25), ("3", 3.0)], ids=str)
def test_go_durations_and_bare_seconds(before, flag, attr, zero_ok, text: str, seconds: float) -> None:
    args = build_parser().parse_args([*before, flag, text])
    assert getattr(args, attr) == seconds


@pytest.mark.parametrize(("before", "flag", "attr", "zero_ok"), DURATION_FLAGS, ids=IDS)
def test_negative_is_refused_in_one_line(before, flag, attr, zero_ok, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*before, f"{flag}=-1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must not be negative" in err


@pytest.mark.parametrize(("before", "flag", "attr", "zero_ok"), DURATION_FLAGS, ids=IDS)
def test_zero_only_where_it_means_something(before, flag, attr, zero_ok, capsys: pytest.CaptureFixture[str]) -> None:
    if zero_ok:
        assert getattr(build_parser().parse_args([*before, flag, "0"]), attr) == 0.0
        return
    with pytest.raises(SystemExit):
        build_parser().parse_args([*before, flag, "0"])
    assert "more than zero" in capsys.readouterr().err
