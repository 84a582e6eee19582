"""The scrape service in a child process, writing back through shared memory.

Why: measured in benchmarks/scrape.py (RESULTS.md), scraping 256 endpoints every 100 ms inside the picker's
process took most of a core and cut the gRPC picker's throughput by far more than the 20% the issue allows. The
picker's process is GIL-bound; a second process scrapes on another core.

How:
- The child (`python -m epp.scrape.process`) runs the ordinary `ScrapeService` on a private table that mirrors
  the parent's membership, and every few milliseconds publishes changed rows into one shared float64 block,
  indexed by the parent's slot: `[token, waiting, running, kv_usage, max_lora, block_size, num_blocks,
  scraped_at, ok, failures, version]`.
- Each row is a seqlock: `version` is odd while the child writes it. The parent copies the block, keeps rows whose
  version was even and unchanged across the copy, and whose `token` matches the endpoint now in that slot (a
  slot reused by another endpoint gets a new token, so late rows of the old one are ignored). Applying them is a
  handful of vector operations (`EndpointTable.write_scrape_rows`), ~100 times a second.
- Membership goes to the child, LoRA adapter changes, per-endpoint statuses and the child's log records come back,
  as pickled messages on a socket pair. If the parent dies, the child sees the socket close and exits.

Supervision: the parent watches the child. When it exits (killed, crashed) or stops reporting (no status message
for `HEARTBEAT_TIMEOUT_S`, or `STARTUP_TIMEOUT_S` before its first one: hung, so it is killed), the parent logs the
death with its exit code or signal and starts a new child on a new block after a backoff (exponential from
`RESTART_INITIAL_S`, doubling up to `RESTART_MAX_S`, ±20 % jitter; reset once a child has run `STABLE_S`). Until
the new child's first pages land, the endpoints age into staleness as with any scrape outage (scorers treat them
as unknown). Readiness stays on: the picker still decides, on its own in-flight counts, and a picker that went
not-ready would turn a scrape outage into 503s for a FailClose pool; `/debug/pool` (`scrapeProcess`) and the
metrics `epp_scrape_process_restarts`, `epp_scrape_process_up` and `epp_scrape_data_age_seconds` show it.

The child's log records are re-emitted by the parent's loggers (epp/observability/relay.py), so they come out in
the parent's format and level.
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
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from epp.datastore.table import EndpointInfo, EndpointTable
from epp.observability.relay import RelayHandler, reemit
from epp.scrape.engines import EngineRegistry
from epp.scrape.scraper import EndpointStatus, ScrapeService, ScrapeSettings
from epp.supervision import RESTART_INITIAL_S, RESTART_MAX_S, STABLE_S, RestartBackoff, describe_exit, watch_pipe

log = logging.getLogger(__name__)

TOKEN, VALUES, OK, FAILURES, VERSION = 0, slice(1, 8), 8, 9, 10
NCOL = 11
PUBLISH_S = 0.005  # child → shared memory
# Shared memory → table, every half scrape interval within these bounds: data ages by at most that much more,
# and the serving loop wakes 40 times a second at the default 50 ms interval instead of 100.
APPLY_MIN_S, APPLY_MAX_S = 0.01, 0.1
STATUS_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0  # a child silent this long (no status message) is hung: killed and restarted
STARTUP_TIMEOUT_S = 30.0  # before its first message: starting an interpreter on a busy node takes seconds


def _untrack(shm: SharedMemory) -> None:
    """Python < 3.13 hands every segment to a resource tracker that unlinks it when *this* process exits; the
    lifetime here is managed explicitly (see `ScrapeProcess._spawn`)."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.unregister(getattr(shm, "_name"), "shared_memory")  # noqa: B009


def _unlink_name(shm: SharedMemory) -> None:
    """Remove the segment's name without touching the resource tracker (`SharedMemory.unlink` would)."""
    with contextlib.suppress(FileNotFoundError):
        getattr(shared_memory, "_posixshmem").shm_unlink(getattr(shm, "_name"))  # noqa: B009


class ScrapeProcess:
    """Same interface as `ScrapeService` (start/stop/status), scraping in a supervised child process."""

    def __init__(
        self,
        table: EndpointTable,
        settings: ScrapeSettings | None = None,
        engines: EngineRegistry | None = None,
        *,
        max_endpoints: int = 65536,
        restart_initial_s: float = RESTART_INITIAL_S,
        restart_max_s: float = RESTART_MAX_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
    ) -> None:
        self.table = table
        self.settings = settings or ScrapeSettings()
        self.engines = engines or EngineRegistry()
        self.rows = max_endpoints
        self._shm: SharedMemory | None = None
        self._block: np.ndarray = np.zeros((0, NCOL))
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._tokens = np.full(max_endpoints, -1.0)
        self._applied = np.zeros(max_endpoints)
        self._members: dict[int, tuple[EndpointInfo, int]] = {}
        self._next_token = 0
        self._seen_version = -1
        self._status: dict[str, EndpointStatus] = {}
        self._warned_full = False
        self._fallback: ScrapeService | None = None
        # supervision
        self._backoff = RestartBackoff(restart_initial_s, restart_max_s, STABLE_S)
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._restart_at: float | None = None
        self._started_at = 0.0
        self._heard_at = 0.0
        self._heard_any = False
        self.restarts = 0
        self.last_exit: str | None = None
        # counters of children gone by, plus the current child's latest
        self._rejected_past: dict[tuple[str, str], int] = {}
        self._rejected_now: dict[tuple[str, str], int] = {}
        self._errors_past: dict[str, int] = {}
        self._errors_now: dict[str, int] = {}

    @property
    def pid(self) -> int | None:
        """The scrape child's process id, None while there is none (between a death and its restart)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def up(self) -> bool:
        return self._proc is not None or self._fallback is not None

    async def start(self) -> None:
        if self._proc is not None or self._fallback is not None or self._task is not None:
            return
        try:
            self._spawn()
        except OSError as exc:  # no /dev/shm, no fork allowed...: scrape on this loop rather than not at all
            log.warning("cannot start the scrape process (%s): scraping in the serving process instead", exc)
            await self.stop()
            self._fallback = ScrapeService(self.table, self.settings, self.engines)
            await self._fallback.start()
            return
        self._task = asyncio.create_task(self._run(), name="scrape-process-apply")

    def _spawn(self) -> None:
        shm = SharedMemory(create=True, size=self.rows * NCOL * 8)
        # Its lifetime is ours: the child unlinks the name as soon as it has mapped the block (the mappings stay),
        # so a picker killed with SIGKILL leaves nothing behind in /dev/shm; no resource tracker is needed.
        _untrack(shm)
        self._shm = shm
        self._block = np.ndarray((self.rows, NCOL), dtype=np.float64, buffer=shm.buf)
        self._block[:] = 0.0
        self._block[:, TOKEN] = -1.0
        self._applied[:] = 0.0  # a new block: versions start again
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "epp.scrape.process", shm.name, str(self.rows), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
        except OSError:
            ours.close()
            theirs.close()
            self._drop_block()
            raise
        theirs.close()
        ours.setblocking(True)
        self._conn = Connection(ours.detach())
        level = logging.getLogger("epp").getEffectiveLevel()
        self._conn.send(("settings", self.settings, self.engines, level))
        watch_pipe(asyncio.get_running_loop(), self._conn, self._on_message)
        self._started_at = self._heard_at = time.monotonic()
        self._heard_any = False
        self._seen_version = -1  # the new child learns the membership from scratch
        self._sync()

    def _drop_block(self) -> None:
        if self._shm is not None:
            self._block = np.zeros((0, NCOL))
            self._shm.close()
            _unlink_name(self._shm)  # normally the child did already
            self._shm = None

    def _drop_channel(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._conn.fileno())
            self._conn.close()
            self._conn = None

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._fallback is not None:
            await self._fallback.stop()
            self._fallback = None
        if self._task is not None:  # first: the supervisor must not restart what is being stopped
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(("stop",))
            self._drop_channel()
        if self._proc is not None:
            proc, self._proc = self._proc, None
            try:
                await loop.run_in_executor(None, proc.wait, 5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                await loop.run_in_executor(None, proc.wait, 5.0)
        self._drop_block()

    def status(self) -> dict[str, EndpointStatus]:
        return self._fallback.status() if self._fallback is not None else dict(self._status)

    def rejected_values(self) -> dict[tuple[str, str], int]:
        """Scraped values refused as implausible, by (signal, reason), over every child this process ran."""
        if self._fallback is not None:
            return dict(self._fallback.rejected_values)
        return _sum_counts(self._rejected_past, self._rejected_now)

    def poll_errors(self) -> dict[str, int]:
        """Failed scrapes by reason (`FAILURE_REASONS`), over every child this process ran."""
        if self._fallback is not None:
            return dict(self._fallback.poll_errors)
        return _sum_counts(self._errors_past, self._errors_now)

    def supervision(self, now: float | None = None) -> dict[str, Any]:
        """For /debug/pool: the child, its restarts, how it last ended."""
        now = time.monotonic() if now is None else now
        return {
            "mode": "in-process" if self._fallback is not None else "child-process",
            "pid": self.pid,
            "up": self.up,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "running_for_s": round(now - self._started_at, 3) if self._proc is not None else None,
            "next_restart_in_s": round(max(0.0, self._restart_at - now), 3) if self._restart_at is not None else None,
        }

    # -- supervision --------------------------------------------------------------------------------------------

    def _supervise(self, now: float) -> None:
        proc = self._proc
        if proc is not None:
            code = proc.poll()
            limit = self._heartbeat_timeout_s if self._heard_any else max(self._heartbeat_timeout_s, STARTUP_TIMEOUT_S)
            if code is None and now - self._heard_at > limit:
                self._on_message()  # a serving loop that was itself blocked may not have read what did arrive
                now = time.monotonic()
            if code is None and now - self._heard_at > limit:
                log.warning("scrape process %d silent for %.1fs (hung?): killing it", proc.pid, now - self._heard_at)
                proc.kill()
                code = proc.wait()
            if code is not None:
                self._child_died(proc, code, now)
            return
        if self._restart_at is not None and now >= self._restart_at:
            self._restart_at = None
            try:
                self._spawn()
            except OSError as exc:
                self._schedule_restart(now, f"restart failed: {exc}")
                return
            self.restarts += 1
            log.warning("scrape process restarted (pid %d, restart %d)", self.pid, self.restarts)

    def _child_died(self, proc: subprocess.Popen[bytes], code: int, now: float) -> None:
        self._proc = None
        self._drop_channel()
        self._drop_block()
        self._rejected_past, self._rejected_now = _sum_counts(self._rejected_past, self._rejected_now), {}
        self._errors_past, self._errors_now = _sum_counts(self._errors_past, self._errors_now), {}
        how = describe_exit(code)
        self.last_exit = how
        ran = now - self._started_at
        self._backoff.died_after(ran)
        self._schedule_restart(now, f"scrape process {proc.pid} died ({how}) after {ran:.1f}s")

    def _schedule_restart(self, now: float, why: str) -> None:
        delay = self._backoff.next_delay()
        self._restart_at = now + delay
        log.warning("%s; restarting in %.1fs; endpoint metrics age until then", why, delay)

    # -- parent side --------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        table = self.table
        if table.version == self._seen_version or self._conn is None:
            return
        self._seen_version = table.version
        members: dict[int, tuple[EndpointInfo, int]] = {}
        within, beyond = table.members(self.rows)
        if beyond and not self._warned_full:
            log.warning("more than %d endpoints: the rest are not scraped", self.rows)
            self._warned_full = True
        for slot, info in within:
            old = self._members.get(slot)
            if old is not None and old[0] == info:
                members[slot] = old
            else:
                members[slot] = (info, self._next_token)
                self._tokens[slot] = self._next_token
                self._next_token += 1
        for slot in set(self._members) - set(members):
            self._tokens[slot] = -1.0
        self._members = members
        wanted = {info.address for info, _ in members.values()}
        self._status = {a: s for a, s in self._status.items() if a in wanted}
        for info, _ in members.values():
            self._status.setdefault(
                info.address, EndpointStatus(info.address, self.engines.for_engine(info.engine).name)
            )
        with contextlib.suppress(OSError):
            self._conn.send(("members", [(slot, token, info) for slot, (info, token) in members.items()]))

    def apply(self) -> int:
        """Copy consistent, current rows from shared memory into the table; returns how many were applied."""
        self._sync()  # tokens must match the table as it is now, or a reused slot could take the old rows
        n = min(len(self.table.column("present")), self.rows)
        if n == 0 or self._shm is None:
            return 0
        slots, rows = read_rows(self._block[:n], self._tokens[:n], self._applied[:n])
        if slots.size:
            self.table.write_scrape_rows(slots, rows[:, VALUES], rows[:, OK] > 0, rows[:, FAILURES].astype(np.int64))
            self._applied[slots] = rows[:, VERSION]
        return int(slots.size)

    async def _run(self) -> None:
        s = self.settings
        every = min(APPLY_MAX_S, max(APPLY_MIN_S, s.interval_s / 2))
        while True:
            await asyncio.sleep(every)
            try:
                self._supervise(time.monotonic())
                self._sync()
                self.apply()
            except Exception:  # the supervisor must outlive any surprise, or nothing restarts the child again
                log.exception("scrape supervisor pass failed")

    def _on_message(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            while conn.poll():
                self._handle(conn.recv())
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(conn.fileno())

    def _handle(self, msg: tuple[Any, ...]) -> None:
        self._heard_at = time.monotonic()
        self._heard_any = True
        if msg[0] == "adapters":
            for slot, token, running, waiting in msg[1]:
                if self._tokens[slot] == token:
                    self.table.set_adapters(slot, running, waiting)
        elif msg[0] == "status":
            for address, status in msg[1].items():
                if address in self._status:
                    self._status[address] = status
            if len(msg) > 3:
                self._rejected_now, self._errors_now = dict(msg[2]), dict(msg[3])
        elif msg[0] == "log":
            reemit(msg[1], "epp-scrape")


def read_rows(live: np.ndarray, tokens: np.ndarray, applied: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, copies of those rows) of a seqlocked block that are complete, newer than `applied` (their
    last applied versions) and still about the endpoint whose token the reader holds for that row."""
    before = live[:, VERSION].copy()
    data = live.copy()
    ok = (before == live[:, VERSION]) & (before % 2 == 0) & (data[:, TOKEN] == tokens)
    ok &= data[:, VERSION] > applied
    slots = np.flatnonzero(ok)
    return slots, data[slots]


def write_rows(
    block: np.ndarray, rows: np.ndarray, tokens: np.ndarray, values: np.ndarray, ok: np.ndarray, failures: np.ndarray
) -> None:
    """The writer's half of the seqlock: `version` odd while the rows are written, even once they are whole."""
    block[rows, VERSION] += 1  # odd: being written
    block[rows, TOKEN] = tokens
    block[rows, VALUES] = values
    block[rows, OK] = ok
    block[rows, FAILURES] = failures
    block[rows, VERSION] += 1  # even: complete


def _sum_counts(past: dict[Any, int], now: dict[Any, int]) -> dict[Any, int]:
    out = dict(past)
    for key, count in now.items():
        out[key] = out.get(key, 0) + count
    return out


# -- child side -------------------------------------------------------------------------------------------------


async def _child(block: np.ndarray, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    first = conn.recv()
    settings: ScrapeSettings = first[1]
    engines: EngineRegistry = first[2]
    logging.getLogger().setLevel(first[3] if len(first) > 3 else logging.WARNING)  # the parent's level
    table = EndpointTable()
    svc = ScrapeService(table, settings, engines)
    stop = asyncio.Event()
    by_address: dict[str, tuple[int, int]] = {}  # address → (parent slot, token)

    def on_message() -> None:
        nonlocal by_address
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "members":
                    by_address = {info.address: (slot, token) for slot, token, info in msg[1]}
                    table.replace_all(info for _, _, info in msg[1])
                    table.version += 1  # a token may change with the same membership: remap
                elif msg[0] == "stop":
                    stop.set()
        except (EOFError, OSError):
            stop.set()

    watch_pipe(loop, conn, on_message)
    await svc.start()
    next_status = loop.time() + STATUS_S
    mapped = -1
    parent = np.zeros(0, dtype=np.int64)
    tokens = np.zeros(0)
    last_at = np.zeros(0)
    last_failures = np.zeros(0, dtype=np.int64)
    adapters: list[tuple[frozenset[str], frozenset[str]] | None] = []
    try:
        published = -1
        while not stop.is_set():
            await asyncio.sleep(PUBLISH_S)
            if loop.time() >= next_status:
                next_status = loop.time() + STATUS_S
                conn.send(("status", svc.status(), svc.rejected_values, svc.poll_errors))
            if table.scrape_version == published and table.version == mapped:
                continue  # no scrape landed since the last pass: nothing to copy or compare
            published = table.scrape_version
            snap = table.snapshot()
            n = len(snap.present)
            if snap.version != mapped:  # membership changed: map local slots to parent rows, republish all
                mapped = snap.version
                parent = np.full(n, -1, dtype=np.int64)
                tokens = np.full(n, -1.0)
                for local, address in enumerate(snap.addresses):
                    where = by_address.get(address)
                    if where is not None and snap.present[local]:
                        parent[local], tokens[local] = where
                last_at = np.full(n, -np.inf)
                last_failures = np.full(n, -1, dtype=np.int64)
                adapters = [None] * n
            at = np.nan_to_num(snap.scraped_at, nan=-1.0)
            changed = np.flatnonzero((parent >= 0) & ((at != last_at) | (snap.scrape_failures != last_failures)))
            if changed.size:
                rows = parent[changed]
                values = np.stack(
                    (snap.waiting, snap.running, snap.kv_usage, snap.max_lora, snap.block_size, snap.num_blocks,
                     snap.scraped_at), axis=1,
                )[changed]  # fmt: skip
                write_rows(block, rows, tokens[changed], values, snap.scrape_ok[changed], snap.scrape_failures[changed])
                last_at[changed] = at[changed]
                last_failures[changed] = snap.scrape_failures[changed]
                news = []
                for local in changed.tolist():
                    pair = (snap.running_adapters[local], snap.waiting_adapters[local])
                    if snap.scrape_ok[local] and adapters[local] != pair:
                        adapters[local] = pair
                        news.append((int(parent[local]), float(tokens[local]), sorted(pair[0]), sorted(pair[1])))
                if news:
                    conn.send(("adapters", news))
    except (EOFError, OSError):
        pass
    finally:
        loop.remove_reader(conn.fileno())
        await svc.stop()


def _child_main(argv: list[str]) -> int:
    shm = SharedMemory(name=argv[1], create=False)
    _untrack(shm)
    _unlink_name(shm)  # both sides have it mapped: drop the name
    try:
        block = np.ndarray((int(argv[2]), NCOL), dtype=np.float64, buffer=shm.buf)
        conn = Connection(int(argv[3]))
        # Every record goes to the parent, which logs it in its own format (no output of the child's own).
        root = logging.getLogger()
        root.handlers[:] = [RelayHandler(lambda data: conn.send(("log", data)))]
        root.setLevel(logging.WARNING)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_child(block, conn))
        del block
    finally:
        shm.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(_child_main(sys.argv))
