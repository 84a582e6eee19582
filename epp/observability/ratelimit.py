"""Log lines that repeat at most once per interval, saying how many were held back.

A fault that repeats (a watch answering 410 after every list, an endpoint flapping) must show in the log, but
once, not once per retry: an on-call engineer needs the first line and a count, and a log pipeline that takes a
line per API call drowns everything else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """`log(key, level, msg, *args)`: logs at most once per `every_s` per key; later lines add "(N more since)".

    The clock is an argument so the decision of what to hold back can be tested without waiting.
    """

    def __init__(
        self, logger: logging.Logger, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def log(self, key: object, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log now, or count the line as held back; True when it was logged (`exc_info`: with the traceback of
        the exception being handled)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        if len(self._last) > 10_000:  # keys are bounded by the caller; this only guards against a mistake
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg += " (%d similar lines held back in the last %.0fs)"
            args = (*args, held, self._every_s)
        self._logger.log(level, msg, *args, stacklevel=2, exc_info=exc_info)
        return True

    def held(self, key: object) -> int:
        return self._held.get(key, 0)
