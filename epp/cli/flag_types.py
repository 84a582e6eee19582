"""argparse types for duration flags: `epp.config.durations` (Go's grammar, or bare seconds) as a flag error.

argparse keeps the message of an ArgumentTypeError (a ValueError becomes "invalid value"), so the operator reads
what is wrong with `--grace-period 10x` in one line, exit code 2.
"""

from __future__ import annotations

import argparse

from epp.config.durations import parse_duration


def duration(text: str) -> float:
    """A duration that may be zero (`--grace-period 0`: stop at once), never negative."""
    return _flag(text, positive=False)


def positive_duration(text: str) -> float:
    """A duration that must be more than zero: an interval, a timeout, a lease period."""
    return _flag(text, positive=True)


def _flag(text: str, positive: bool) -> float:
    try:
        return parse_duration(text, bare_seconds=True, positive=positive)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
