"""Log records of a child process, re-emitted by the parent through the parent's own handlers.

A child process's stderr is not the picker's log: its lines would carry another format (or none, under a JSON log
pipeline) and a child started without a terminal loses them. So the child sends each record as plain data over the
channel it already shares with the parent, and the parent hands it to the logger of the same name: the record comes
out formatted exactly like the parent's own (text or JSON, whatever the parent configured), with the child's
time, level, logger name and process id.

The child side is rate-limited (a burst, then a steady rate): a child in a tight failure loop must not block on its
channel or flood the parent's log; what it drops is counted into the next record it sends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

RELAYED_FIELDS = (
    *("name", "levelno", "levelname", "msg", "created", "msecs", "pathname", "filename", "module"),
    *("lineno", "funcName", "exc_text", "stack_info", "threadName", "process"),
)


def record_to_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The picklable essentials of a record: its message already formatted, its traceback as text."""
    data = {key: getattr(record, key, None) for key in RELAYED_FIELDS}
    data["msg"] = record.getMessage()
    if record.exc_info and not record.exc_text:
        data["exc_text"] = logging.Formatter().formatException(record.exc_info)
    return data


class RelayHandler(logging.Handler):
    """Child side: sends every record it accepts through `send` (a `Connection.send` bound to a message tag)."""

    def __init__(
        self,
        send: Callable[[dict[str, Any]], None],
        rate_per_s: float = 20.0,
        burst: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._send = send
        self._rate = rate_per_s
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._at = clock()
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            self.dropped += 1
            return
        self._tokens -= 1.0
        data = record_to_dict(record)
        if self.dropped:
            data["msg"] += f" ({self.dropped} earlier log records of this process dropped: too many)"
            self.dropped = 0
        try:
            self._send(data)
        except (OSError, EOFError, ValueError):  # the parent is gone; the child exits on its own
            pass


def reemit(data: dict[str, Any], process_name: str) -> None:
    """Parent side: log a relayed record through the logger of its name, if that logger would show its level."""
    name = str(data.get("name") or "root")
    level = int(data.get("levelno") or logging.INFO)
    logger = logging.getLogger(name)
    if not logger.isEnabledFor(level):
        return
    record = logging.makeLogRecord({**data, "args": None, "exc_info": None, "processName": process_name})
    logger.handle(record)
