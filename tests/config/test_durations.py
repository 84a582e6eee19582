"""One duration grammar for every flag and config field: Go's time.ParseDuration, in seconds."""

from __future__ import annotations

import pytest

from epp.config.durations import parse_duration

GO_DURATIONS = [
    ("1h2m3.5s", 3723.5),
    ("300ms", 0.3),
    ("1.5us", 1.5e-6),
    ("10µs", 1e-5),  # U+00B5 micro sign
    ("10μs", 1e-5),  # U+03BC Greek mu, which Go accepts too
    ("7ns", 7e-9),
    ("1m30s", 90.0),
    ("1.5h", 5400.0),
    ("2s", 2.0),
    (".5s", 0.5),
    ("1.s", 1.0),
    ("+5s", 5.0),
    ("0", 0.0),
    ("0s", 0.0),
    ("1h1h", 7200.0),  # Go sums repeated units
]


@pytest.mark.parametrize(("text", "seconds"), GO_DURATIONS, ids=[t for t, _ in GO_DURATIONS])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not a duration"),
        ("fast", "not a duration"),
        ("ms", "not a duration"),
        (".s", "not a duration"),
        ("2", "missing unit"),  # Go: a number needs a unit, except 0
        ("1.5.5s", "missing unit"),
        ("5 ms", "unknown unit ' ms'"),  # no spaces in Go's grammar
        (" 5ms", "not a duration"),
        ("1d", "unknown unit 'd'"),
        ("1e3s", "unknown unit 'e'"),
        ("-1s", "must not be negative"),
        ("-0.5ms", "must not be negative"),
        ("2562048h", "292 years"),
    ],
    ids=str,
)
def test_refusals_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "seconds"), [("2", 2.0), ("0.05", 0.05), (".5", 0.5), ("0", 0.0), ("50ms", 0.05)], ids=str
)
def test_bare_seconds_where_the_caller_takes_them(value: str, seconds: float) -> None:
    assert parse_duration(value, bare_seconds=True) == seconds


@pytest.mark.parametrize("value", ["-1", "-0.5", "inf", "nan", "1e3"], ids=str)
def test_bare_seconds_are_plain_non_negative_numbers(value: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(value, bare_seconds=True)


@pytest.mark.parametrize(("value", "seconds"), [(3, 3.0), (0.25, 0.25), (0, 0.0)], ids=str)
def test_yaml_numbers_are_seconds(value: float, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [True, None, [1], -1, float("nan"), float("inf")], ids=str)
def test_other_values_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", ["0", "0s", 0, "0.0"], ids=str)
def test_positive_refuses_zero(value: object) -> None:
    with pytest.raises(ValueError, match="more than zero"):
        parse_duration(value, bare_seconds=True, positive=True)
