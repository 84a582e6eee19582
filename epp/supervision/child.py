"""`Child`: one supervised child process, the parent's side. Every child of the picker is one (the scrape child, each
serving worker, the KV-events feeder), so they share one lifecycle and one set of rules:

- Spawn: `python -m epp.supervision.launch <module> <pipe fd> <parent pid> <shared fds...>`, which runs the
  module's `child_main(end)` (epp.supervision.child_end); the pipe is a socket pair carrying pickled
  dataclasses (epp.supervision.messages, plus the child's own); shared memory is memfd only
  (epp.supervision.memory), its descriptors inherited. The first message is `Start` with the owner's payload,
  which the kit does not look into.
- Hang policy, the same for every child: a child that has not said `Ready` within `start_timeout_s`, or that said
  nothing for `heartbeat_timeout_s` after it (the child's end sends a `Heartbeat` when it has been quiet a
  second), is killed. Before that verdict the pipe is read once more: a parent loop that was itself blocked may
  not have read what did arrive.
- Restart: a child that exits (killed, crashed, hung) is logged with how it ended (`describe_exit`) and started
  again after the backoff (epp.supervision.backoff), on fresh shared memory if its owner makes it so.
- Shutdown: once `begin_shutdown()` or `stop()` ran, nothing is restarted; a child that ends then is logged at
  INFO, not as a death. A child never dies of the signals meant for its parent (SIGTERM or SIGINT to the process
  group: systemd's default KillMode, Ctrl-C): while its parent lives it ignores them, and the parent stops it in
  order (`Stop`, a drain, then SIGKILL after `stop()`'s timeout).
- Wakes: the parent learns of a death from the kernel (a pidfd, readable when the child exits) and from the pipe's
  EOF, so it reaps and schedules the restart at once; the hang and start-timeout verdicts and a restart that is
  due are checked on a coarse timer (`CHECK_S`, woken early for a due restart). An idle picker's control process
  thus wakes about once a second per child, not ten times.
- Orphans: a child notices within a second that its parent is gone, however the parent ended (SIGKILL too): the
  kernel's parent-death signal (PR_SET_PDEATHSIG) and the pipe's EOF both tell it (epp.supervision.child_end).

The owner gives hooks: `on_start` (after a spawn: send what the new child must know), `on_message` (its own
messages), `on_ready`, `on_exit` (the child ended: clear what it held). `report()` is the dict /debug/pool shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from epp.observability.relay import reemit
from epp.supervision.backoff import RESTART_INITIAL_S, RESTART_MAX_S, STABLE_S, RestartBackoff, describe_exit
from epp.supervision.loop import wait_set
from epp.supervision.messages import Heartbeat, Log, Ready, Start, Stop
from epp.supervision.pipe import send_fd, watch_pipe

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # spawn → Ready: an interpreter, numpy and a gRPC server on a busy node take seconds
HEARTBEAT_TIMEOUT_S = 10.0  # silent this long after Ready: hung
CHECK_S = 1.0  # how often the parent looks at its child's silence; exits wake it at once (pidfd, pipe EOF)
STOP_TIMEOUT_S = 5.0  # after `Stop` (and any drain the owner allows): SIGKILL


@dataclass(frozen=True, slots=True)
class Policy:
    """Timeouts and backoff of one child; the defaults are every child's."""

    start_timeout_s: float = START_TIMEOUT_S
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    restart_initial_s: float = RESTART_INITIAL_S
    restart_max_s: float = RESTART_MAX_S
    stable_s: float = STABLE_S


def _nothing(*_: Any) -> None:
    return None


class Child:
    """Starts, watches, restarts and stops one child process (see the module docstring)."""

    def __init__(
        self,
        module: str,
        label: str,
        *,
        payload: Callable[[], Any],
        on_message: Callable[[Any], None] = _nothing,
        fds: Callable[[], Sequence[int]] = tuple,
        on_start: Callable[[], None] = _nothing,
        on_ready: Callable[[], None] = _nothing,
        on_exit: Callable[[int], None] = _nothing,
        policy: Policy = Policy(),
        relay_as: str = "",
        consequence: str = "",
    ) -> None:
        self.module = module
        self.label = label  # "scrape process {pid}", "worker 0 (pid {pid})": how log lines name the child
        self.policy = policy
        self.backoff = RestartBackoff(policy.restart_initial_s, policy.restart_max_s, policy.stable_s)
        self._payload = payload
        self._fds = fds
        self._on_message = on_message
        self._on_start = on_start
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._relay_as = relay_as or module
        self._consequence = consequence  # said after "restarting in Ns": what the picker lacks until then
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.ready = False
        self.restarts = 0
        self.last_exit: str | None = None
        self.started_at = 0.0
        self.heard_at = 0.0
        self.restart_at: float | None = None
        self.stopping = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set by the child's exit (pidfd) or the pipe's EOF: `_watch` looks now
        self._pidfd: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def name(self, pid: int | None = None) -> str:
        return self.label.format(pid=self.pid if pid is None else pid)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the child (OSError if it cannot be) and watch it from the running loop."""
        self.stopping = False
        self._spawn()
        self._task = asyncio.get_running_loop().create_task(self._watch(), name=f"supervise {self.module}")

    def begin_shutdown(self) -> None:
        """From now on nothing is restarted: the picker is stopping."""
        self.stopping = True
        self.restart_at = None

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """`Stop` to the child, up to `timeout_s` for it to exit, then SIGKILL. Nothing restarts it after."""
        self.begin_shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.send(Stop())
        proc = self.proc
        if proc is None:
            return
        loop = asyncio.get_running_loop()
        try:
            code = await loop.run_in_executor(None, proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.1fs: killing it", self.name(), timeout_s)
            proc.kill()
            code = await loop.run_in_executor(None, proc.wait, 5.0)
        self._ended(code, time.monotonic())

    def send(self, msg: Any) -> bool:
        """A message to the child; False if there is no child to take it (between a death and its restart)."""
        if self.conn is None:
            return False
        try:
            self.conn.send(msg)
        except OSError:
            return False
        return True

    def send_with_fd(self, msg: Any, fd: int) -> bool:
        """`send`, then a descriptor (a memfd) on the pipe right after it (epp.supervision.pipe.send_fd); the child
        reads it with `recv_fd` once it has read the message. False if there is no child to take it."""
        if self.conn is None:
            return False
        try:
            self.conn.send(msg)
            send_fd(self.conn, fd)
        except OSError:
            return False
        return True

    def report(self, now: float) -> dict[str, Any]:
        """For /debug/pool: the process, its restarts, how it last ended, when the next restart comes."""
        return {
            "pid": self.pid,
            "up": self.proc is not None,
            "ready": self.ready,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "running_for_s": round(now - self.started_at, 3) if self.proc is not None else None,
            "next_restart_in_s": round(max(0.0, self.restart_at - now), 3) if self.restart_at is not None else None,
        }

    # -- inside -------------------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        shared = tuple(self._fds())  # first: if the owner cannot make its shared memory, no pipe is left open
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", "epp.supervision.launch", self.module, str(theirs.fileno()), str(os.getpid())]
        argv += map(str, shared)
        try:
            self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(), *shared))
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(True)
        self.conn = Connection(ours.detach())
        self.conn.send(Start(self._payload(), logging.getLogger("epp").getEffectiveLevel()))
        self.started_at = self.heard_at = time.monotonic()
        self.ready = False
        watch_pipe(asyncio.get_running_loop(), self.conn, self._readable)
        self._watch_exit()
        self._on_start()

    def _watch_exit(self) -> None:
        """The kernel's word that the child exited (a pidfd turns readable) wakes `_watch` at once; where there
        are no pidfds (not Linux, an old kernel) the pipe's EOF does, and the coarse timer at the latest."""
        self._unwatch_exit()
        if self.proc is None or not hasattr(os, "pidfd_open"):
            return
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except OSError:
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._wake.set)

    def _unwatch_exit(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is None:
            return
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)

    def _readable(self) -> None:
        conn = self.conn
        if conn is None:
            return
        try:
            while conn.poll():
                self._handle(conn.recv())
        except (EOFError, OSError):  # the child is gone: `_check` reaps it, now
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(conn.fileno())
            self._wake.set()

    def _handle(self, msg: Any) -> None:
        self.heard_at = time.monotonic()
        if isinstance(msg, Log):
            reemit(msg.record, self._relay_as)
        elif isinstance(msg, Heartbeat):
            pass
        elif isinstance(msg, Ready):
            self.ready = True
            self._on_ready()
        else:
            self._on_message(msg)

    async def _watch(self) -> None:
        while True:
            await wait_set(self._wake, self._next_look(time.monotonic()))
            self._wake.clear()
            try:
                self._check(time.monotonic())
            except Exception:  # the supervisor must outlive any surprise, or nothing restarts the child again
                log.exception("supervising %s failed", self.module)

    def _check(self, now: float) -> None:
        proc = self.proc
        if proc is not None:
            code = proc.poll()
            if code is None and self._silent(now):
                self._readable()  # a parent loop that was itself blocked may not have read what did arrive
                now = time.monotonic()
                if self._silent(now):
                    if self.ready:
                        log.warning("%s silent for %.1fs (hung?): killing it", self.name(), now - self.heard_at)
                    else:
                        log.warning("%s not ready after %.0fs: killing it", self.name(), now - self.started_at)
                    proc.kill()
                    code = proc.wait()
            if code is not None:
                self._ended(code, now)
            return
        if self.restart_at is not None and now >= self.restart_at and not self.stopping:
            self.restart_at = None
            try:
                self._spawn()
            except OSError as exc:
                self._schedule_restart(now, f"{self.module} restart failed: {exc}")
                return
            self.restarts += 1
            log.warning("%s restarted (restart %d)", self.name(), self.restarts)

    def _next_look(self, now: float) -> float:
        """Seconds until `_watch` must look whatever wakes it: `CHECK_S`, or sooner when a restart falls due."""
        if self.proc is None and self.restart_at is not None:
            return min(CHECK_S, max(0.0, self.restart_at - now))
        return CHECK_S

    def _silent(self, now: float) -> bool:
        if self.ready:
            return now - self.heard_at > self.policy.heartbeat_timeout_s
        return now - self.started_at > self.policy.start_timeout_s

    def _ended(self, code: int, now: float) -> None:
        proc, self.proc = self.proc, None
        pid = proc.pid if proc is not None else None
        self._unwatch_exit()
        if self.conn is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.conn.fileno())
            self.conn.close()
            self.conn = None
        self.ready = False
        self.last_exit = describe_exit(code)
        ran = now - self.started_at
        self.backoff.died_after(ran)
        self._on_exit(code)
        if self.stopping:
            log.info("%s exited (%s)", self.name(pid), self.last_exit)
            return
        self._schedule_restart(now, f"{self.name(pid)} died ({self.last_exit}) after {ran:.1f}s")

    def _schedule_restart(self, now: float, why: str) -> None:
        delay = self.backoff.next_delay()
        self.restart_at = now + delay
        log.warning("%s; restarting in %.1fs%s", why, delay, self._consequence)
