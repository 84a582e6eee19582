"""Logging set-up: one line per record, levels from `-v` as upstream's verbosity (0 warn, 1 info, 2+ debug).

Also `RateLimitedLog`, for lines a hostile or broken peer could repeat per request: one per interval, counted.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # grpc and aiohttp are chatty at INFO; their warnings still show.
    for noisy in ("aiohttp.access", "grpc"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


class RateLimitedLog:
    """One line per key and interval; the lines held back are counted into the next one."""

    __slots__ = ("_clock", "_interval_s", "_last", "_logger", "_suppressed")

    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        self._emit(logging.WARNING, key, message, args, False)

    def exception(self, key: str, message: str, *args: object) -> None:
        """At ERROR with the traceback of the exception being handled."""
        self._emit(logging.ERROR, key, message, args, True)

    def _emit(self, level: int, key: str, message: str, args: tuple[object, ...], exc_info: bool) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last[key] = now
        held = self._suppressed.pop(key, 0)
        if held:
            message += " (%d more since the last line)"
            args = (*args, held)
        self._logger.log(level, message, *args, exc_info=exc_info)
