"""Durations, the one way every flag and config field reads them: Go's `time.ParseDuration` grammar, in seconds.

Upstream's flags and config fields are Go durations, so an operator's `1h2m3.5s`, `300ms`, `1.5us` or `10µs` must
mean here what it means there: a sequence of decimal numbers, each with a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`,
`m`, `h`), an optional leading sign, no spaces; `0` alone needs no unit. Two additions, both where this picker has
always taken them: a bare number of seconds (`2`, `0.05`) where the caller allows it (flags, and numbers in YAML),
and the refusal of negative durations, which mean nothing for an interval, a timeout, a threshold or a grace period.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NoReturn

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
# One number with its unit: ASCII digits with an optional fraction (`1.` and `.5` are Go's too); the unit is all up
# to the next number, checked against the table so that `5d` or `5 ms` names what is wrong.
_TERM = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([^0-9.]*)")
_BARE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
_MAX_S = (2**63 - 1) * 1e-9  # Go's Duration is an int64 of nanoseconds (about 292 years)


def parse_duration(value: object, *, bare_seconds: bool = False, positive: bool = False) -> float:
    """Seconds from a Go duration string (or, with `bare_seconds`, a plain number of seconds); ValueError says why.

    A YAML or JSON number (int or float) is always seconds. `positive` also refuses zero, for intervals and
    timeouts where zero would mean "spin" or "never wait".
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '200ms', got a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value, bare_seconds)
    else:
        raise ValueError(f"expected a duration such as '200ms', got {value!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    if positive and seconds == 0:
        raise ValueError(f"must be more than zero, got {value!r}")
    if seconds > _MAX_S:
        raise ValueError(f"longer than any duration (at most about 292 years), got {value!r}")
    return seconds


def _parse_text(text: str, bare_seconds: bool) -> float:
    if bare_seconds and _BARE.fullmatch(text):
        return float(text)
    body = text
    sign = 1.0
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        _not_a_duration(text)
    total_ns = Fraction(0)  # summed exactly, as Go sums integer nanoseconds: `10µs` is 1e-05 s, not 9.99…e-06
    pos = 0
    while pos < len(body):
        term = _TERM.match(body, pos)
        if term is None:
            _not_a_duration(text)
        number, unit = term.groups()
        if unit not in _UNIT_NS:
            if not unit:
                raise ValueError(f"not a duration: {text!r} (missing unit; use e.g. '200ms', '2s')")
            raise ValueError(f"not a duration: {text!r} (unknown unit {unit!r}; known: ns, us, µs, ms, s, m, h)")
        total_ns += Fraction(number) * _UNIT_NS[unit]
        pos = term.end()
    return sign * float(total_ns / 10**9)


def _not_a_duration(text: str) -> NoReturn:
    raise ValueError(f"not a duration: {text!r} (use e.g. '200ms', '2s', '1m30s')")
