"""Every line on stderr a JSON record, under `--zap-encoder json`.

Python's own log lines are JSON already (`logs.JsonLineFormatter`), but not everything a process writes goes
through `logging`: gRPC core's C++ logging (`E1201 12:00:00.000000 123 ssl_transport_security.cc:3238] No match
found for server name: epp`, printed when a TLS client's SNI does not match the certificate), a traceback of a
dying thread, a child process that writes to the stderr it inherited. A log pipeline that expects one JSON object
per line breaks on those, and silencing them (GRPC_VERBOSITY=NONE) would hide real errors.

So `route_stderr_as_json` points file descriptor 2 at a pipe (children spawned later inherit it too) and a
daemon thread copies the pipe to the real stderr line by line: a line that is a JSON object already passes as it
is; any other becomes a record in the log's own format (`ts`, `level`, `logger`: `grpc` or `stderr`, `msg`), its
level read from gRPC core's prefix letter (E error, W warn, I info, D debug; error when there is none, as for a
traceback). The Python log
handler keeps writing to the real stderr directly (`sys.stderr` is re-opened on it), so its lines are not copied.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
import time

import orjson

from epp.observability.logs import JsonLineFormatter

_GRPC_PREFIX = re.compile(rb"^([EWID])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (\S+:\d+)\] ?(.*)$")
_LEVELS = {b"E": logging.ERROR, b"W": logging.WARNING, b"I": logging.INFO, b"D": logging.DEBUG}
_MAX_LINE = 64 * 1024  # a longer line is cut into records of this size


def json_line(line: bytes, now: float, formatter: JsonLineFormatter) -> bytes:
    """One line of stderr as one JSON record in the log's own format (a JSON object line as it is), newline
    included."""
    stripped = line.rstrip(b"\r\n")
    if stripped.startswith(b"{"):
        with contextlib.suppress(orjson.JSONDecodeError):
            if isinstance(orjson.loads(stripped), dict):
                return stripped + b"\n"
    name, level, fields = "stderr", logging.ERROR, {}
    match = _GRPC_PREFIX.match(stripped)
    if match is not None:
        name, level = "grpc", _LEVELS[match.group(1)]
        fields["caller"] = match.group(2).decode(errors="replace")
        message = match.group(3)
    else:
        message = stripped
    fields.update(name=name, levelno=level, levelname=logging.getLevelName(level), created=now)
    fields["msg"] = message.decode(errors="replace")
    return formatter.format(logging.makeLogRecord(fields)).encode() + b"\n"


def _copy(read_fd: int, out_fd: int, formatter: JsonLineFormatter) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            if pending:
                _write(out_fd, json_line(pending, time.time(), formatter))
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        while len(pending) > _MAX_LINE:
            lines.append(pending[:_MAX_LINE])
            pending = pending[_MAX_LINE:]
        for line in lines:
            if line.strip():
                _write(out_fd, json_line(line, time.time(), formatter))


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def route_stderr_as_json(time_encoding: str = "") -> None:
    """File descriptor 2 → a pipe whose lines reach the real stderr as JSON records; `sys.stderr` (the log
    handler's stream) → the real stderr directly. For the process's entry point only (it changes fd 2)."""
    sys.stderr.flush()
    real = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    sys.stderr = open(real, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    copier = threading.Thread(
        target=_copy, args=(read_fd, real, JsonLineFormatter(time_encoding)), name="stderr-json", daemon=True
    )
    copier.start()

    def drain() -> None:  # at exit: what is in the pipe still reaches stderr
        with contextlib.suppress(OSError):
            os.dup2(real, 2)  # our end of the pipe closed (children may still hold theirs)
        copier.join(0.5)

    atexit.register(drain)
