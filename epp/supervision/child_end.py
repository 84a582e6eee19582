"""The child's end of the kit (epp.supervision.child): connect to the parent, follow its rules, die with it.

`ChildEnd.connect(argv)` is the first thing a child does (the kit's launcher, epp.supervision.launch, calls it and
hands the result to the child module's `child_main(end)`). It
- asks the kernel for SIGTERM when the parent dies (PR_SET_PDEATHSIG, through libc's prctl) and checks the parent
  is still the one that spawned it (it may have died before the request was made);
- sends every log record to the parent (epp.observability.relay), which logs it in its own format;
- reads `Start`: the owner's payload and the parent's log level.

`on_parent_gone(callback)` makes SIGTERM and SIGINT mean one thing in a child: the parent is gone (then
`callback` runs: drain and exit). While the parent lives they are ignored: a signal to the whole process group
(Ctrl-C, systemd's default KillMode) is the parent's to act on, and the parent stops its children in order; a
child that died of it would be restarted, or counted as a death, during the parent's own drain. The pipe's EOF
says the same as the parent-death signal, and a child watching its pipe acts on it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from epp.observability.relay import RelayHandler
from epp.supervision.messages import Heartbeat, Log, Ready, Start
from epp.supervision.pipe import send_fd

HEARTBEAT_S = 1.0  # a child quiet this long sends a Heartbeat (the parent's timeout is ten times that)
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Ask for SIGTERM when the parent dies; False if it is already gone (we were re-parented before asking)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    return os.getppid() == parent


class ChildEnd:
    """The pipe to the parent, the shared descriptors it passed, and what it asked this child to do."""

    def __init__(self, conn: Connection, parent: int, fds: Sequence[int], start: Start) -> None:
        self.conn = conn
        self.parent = parent
        self.fds = tuple(fds)
        self.payload = start.payload
        self._lock = threading.Lock()  # records may be logged from any thread; one message at a time on the pipe
        self._sent_at = time.monotonic()

    @classmethod
    def connect(cls, argv: Sequence[str]) -> ChildEnd:
        """`argv` as the kit's launcher has it: [module, pipe fd, parent pid, shared fds...]. Exits at once if
        the parent is already gone."""
        for sig in (signal.SIGTERM, signal.SIGINT):  # the parent's signals, until `on_parent_gone` says otherwise
            signal.signal(sig, signal.SIG_IGN)
        conn, parent = Connection(int(argv[1])), int(argv[2])
        if not die_with_parent(parent):
            raise SystemExit(0)
        end: ChildEnd | None = None
        pending: list[dict[str, Any]] = []

        def relay(record: dict[str, Any]) -> None:
            if end is None:
                pending.append(record)
            else:
                end.send(Log(record))

        root = logging.getLogger()
        root.handlers[:] = [RelayHandler(relay)]  # no output of the child's own: the parent logs its records
        root.setLevel(logging.WARNING)
        start = conn.recv()
        if not isinstance(start, Start):
            raise SystemExit(f"expected Start from the parent, got {type(start).__name__}")
        root.setLevel(start.log_level)
        end = cls(conn, parent, [int(a) for a in argv[3:]], start)
        for record in pending:
            end.send(Log(record))
        return end

    def send(self, msg: Any) -> None:
        with self._lock:
            self.conn.send(msg)
            self._sent_at = time.monotonic()

    def send_with_fd(self, msg: Any, fd: int) -> None:
        """`msg`, then the descriptor `fd` attached to the next byte (the parent reads both, in that order)."""
        with self._lock:
            self.conn.send(msg)
            send_fd(self.conn, fd)
            self._sent_at = time.monotonic()

    def ready(self) -> None:
        self.send(Ready())

    def beat(self) -> None:
        """A Heartbeat if nothing went to the parent for `HEARTBEAT_S` (call it from the child's main loop)."""
        if time.monotonic() - self._sent_at >= HEARTBEAT_S:
            with contextlib.suppress(OSError):
                self.send(Heartbeat())

    async def keep_alive(self) -> None:
        """`beat()` from an asyncio child's loop, for as long as the task runs: a blocked loop beats no more."""
        while True:
            await asyncio.sleep(HEARTBEAT_S / 2)
            self.beat()

    def parent_alive(self) -> bool:
        return os.getppid() == self.parent

    def on_parent_gone(self, callback: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None) -> None:
        """SIGTERM/SIGINT: `callback()` if the parent is gone (the parent-death signal), ignored while it lives.
        With `loop`, the handler runs on that loop (asyncio children); without, in the main thread."""

        def on_signal(*_: object) -> None:
            if not self.parent_alive():
                callback()

        for sig in (signal.SIGTERM, signal.SIGINT):
            if loop is not None:
                loop.add_signal_handler(sig, on_signal)
            else:
                signal.signal(sig, on_signal)
        if not self.parent_alive():  # gone before the handlers were in place
            callback()
