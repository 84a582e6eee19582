"""Logging set-up with upstream's knobs: `-v` (its verbosity numbers), `--zap-log-level`, `--zap-encoder json|console`
and `--zap-time-encoding`.

Upstream logs through zap: V(0)-V(3) print at info, V(4) is debug and V(5) trace; its default `-v` is 2. Python's
levels map onto that: 0-1 warnings only, 2-3 info, 4 and more debug (per-request lines are debug only).

`--zap-encoder json` writes one JSON object per line, with zap's production keys (`ts`, `level`, `logger`, `msg`)
followed by the record's own fields (`extra=`), and `error` / `stacktrace` when an exception is attached, so
log pipelines built for upstream's lines read ours.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

import orjson

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field of the line.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_ZAP_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_ZAP_LEVELS |= {"dpanic": logging.CRITICAL, "panic": logging.CRITICAL, "fatal": logging.CRITICAL}


def level_of(verbosity: int, zap_log_level: str = "") -> int:
    """The Python level for upstream's `-v` and `--zap-log-level` (which wins when given)."""
    if zap_log_level:
        named = _ZAP_LEVELS.get(zap_log_level.strip().lower())
        if named is not None:
            return named
        try:
            verbosity = int(zap_log_level)
        except ValueError:
            raise ValueError(
                f"--zap-log-level: {zap_log_level!r} is not debug, info, error, panic or a number"
            ) from None
    if verbosity <= 1:
        return logging.WARNING
    return logging.INFO if verbosity <= 3 else logging.DEBUG


def _timestamp(created: float, encoding: str) -> float | int | str:
    if encoding == "epoch":
        return created
    if encoding == "millis":
        return created * 1000.0
    if encoding == "nano":
        return int(created * 1e9)
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    if encoding == "rfc3339":
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if encoding == "rfc3339nano":
        return moment.isoformat().replace("+00:00", "Z")
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"  # iso8601, the default


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, then the record's `extra=` fields."""

    def __init__(self, time_encoding: str = "") -> None:
        super().__init__()
        self._time_encoding = time_encoding

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record.created, self._time_encoding),
            "level": record.levelname.lower().replace("warning", "warn").replace("critical", "error"),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in line:
                line[key] = value
        if record.exc_info:
            line["error"] = repr(record.exc_info[1])
            line["stacktrace"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(
    verbosity: int = 2, encoder: str = "console", zap_log_level: str = "", time_encoding: str = ""
) -> None:
    level = level_of(verbosity, zap_log_level)
    handler = logging.StreamHandler(sys.stderr)
    if encoder == "json":
        handler.setFormatter(JsonLineFormatter(time_encoding))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # grpc and aiohttp are chatty at INFO; their warnings still show.
    for noisy in ("aiohttp.access", "grpc"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
