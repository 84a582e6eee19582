"""The scrape service in a child process, writing back through shared memory.

Why: measured in benchmarks/scrape.py (RESULTS.md), scraping 256 endpoints every 100 ms inside the picker's
process took most of a core and cut the gRPC picker's throughput by far more than the 20% the issue allows. The
picker's process is GIL-bound; a second process scrapes on another core.

How:
- The child (`python -m epp.scrape.child`, started through the child-process kit, epp.supervision.child) runs the
  ordinary `ScrapeService` on a private table that mirrors the parent's membership, and after each scrape round
  publishes the rows whose values changed into one shared float64 block (a memfd), indexed by the parent's slot,
  in the shared-row layout (epp.datastore.rows: token, the scraped values, ok, failures, version), and tells the
  parent (`Landed`). A row whose page repeated its values only gets a stamp (its scrape's time, in a second memfd
  the parent keeps for its life and shares with its serving workers): no write, no message; the parent's table
  reads the stamps as it is read (`EndpointTable.follow_stamps`), so an idle pool costs the parent nothing.
- Each row is a seqlock: `version` is odd while the child writes it. The parent copies the block, keeps rows whose
  version was even and unchanged across the copy, and whose `token` matches the endpoint now in that slot (a
  slot reused by another endpoint gets a new token, so late rows of the old one are ignored). Applying them is a
  handful of vector operations (`EndpointTable.write_scrape_rows`), done in the pipe's callback as `Landed` arrives.
- Membership goes to the child, LoRA adapter changes, per-endpoint statuses and the child's log records come back,
  as typed messages on the kit's pipe (epp.scrape.child). If the parent dies, the child exits within a second.

Supervision is the kit's, the same as every child's: a child that exits (killed, crashed) or hangs (not ready
within the start timeout, or silent for the heartbeat timeout after it: killed) is logged with its exit code or
signal and started again on a new block after the backoff (epp.supervision.backoff); none once the picker stops. Until
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
import time
from typing import Any

import numpy as np

from epp.datastore.rows import FAILURES, NCOL, OK, TOKEN, VALUES, VERSION, read_rows
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.child import Adapters, Landed, Members, ScrapeStart, Status
from epp.scrape.engines import EngineRegistry
from epp.scrape.scraper import EndpointStatus, ScrapeService, ScrapeSettings
from epp.supervision.backoff import RESTART_INITIAL_S, RESTART_MAX_S
from epp.supervision.child import HEARTBEAT_TIMEOUT_S, Child, Policy
from epp.supervision.loop import wait_set
from epp.supervision.memory import map_array, new_memfd

log = logging.getLogger(__name__)

# Shared memory → table when the child says rows landed (it gathers a scrape round into one pass), and the membership
# sent when the table's changes; this look whatever happens only guards against a lost wake-up.
APPLY_SAFETY_S = 1.0


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
        self._fd = -1  # the new block's memfd, between its creation and the spawn that hands it over
        # The stamps (epp.datastore.rows): one memfd made at the first start, every child's, shared with the workers.
        self.stamps_fd = -1
        self.stamps: np.ndarray = np.zeros(1)
        self._block: np.ndarray = np.zeros((0, NCOL))
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # rows landed in the block, or the table's membership changed
        table.add_membership_listener(self._wake.set)
        self._tokens = np.full(max_endpoints, -1.0)
        self._applied = np.zeros(max_endpoints)
        self._members: dict[int, tuple[EndpointInfo, int]] = {}
        self._next_token = 0
        self._seen_version = -1
        self._status: dict[str, EndpointStatus] = {}
        self._warned_full = False
        self._fallback: ScrapeService | None = None
        policy = Policy(
            heartbeat_timeout_s=heartbeat_timeout_s, restart_initial_s=restart_initial_s, restart_max_s=restart_max_s
        )
        self.child = Child(
            "epp.scrape.child",
            "scrape process {pid}",
            payload=lambda: ScrapeStart(self.settings, self.engines, self.rows),
            fds=self._new_block,
            on_start=self._started,
            on_message=self._handle,
            on_exit=self._child_died,
            policy=policy,
            relay_as="epp-scrape",
            consequence="; endpoint metrics age until then",
        )
        # counters of children gone by, plus the current child's latest
        self._rejected_past: dict[tuple[str, str], int] = {}
        self._rejected_now: dict[tuple[str, str], int] = {}
        self._errors_past: dict[str, int] = {}
        self._errors_now: dict[str, int] = {}

    @property
    def pid(self) -> int | None:
        """The scrape child's process id, None while there is none (between a death and its restart)."""
        return self.child.pid

    @property
    def up(self) -> bool:
        return self.child.proc is not None or self._fallback is not None

    @property
    def restarts(self) -> int:
        return self.child.restarts

    @property
    def last_exit(self) -> str | None:
        return self.child.last_exit

    async def start(self) -> None:
        if self.child.proc is not None or self._fallback is not None or self._task is not None:
            return
        try:
            self.child.start()
        except OSError as exc:  # no memfd, no fork allowed...: scrape on this loop rather than not at all
            log.warning("cannot start the scrape process (%s): scraping in the serving process instead", exc)
            await self.stop()
            self._fallback = ScrapeService(self.table, self.settings, self.engines)
            await self._fallback.start()
            return
        self._task = asyncio.create_task(self._run(), name="scrape-process-apply")

    def _new_block(self) -> tuple[int, int]:
        """A fresh block for the child about to start (a dead child's late writes cannot reach the new one)."""
        self._drop_block()  # a block made for a spawn that failed
        if self.stamps_fd < 0:  # the first start (or one after a stop)
            self.stamps_fd = new_memfd("scrape-stamps", (self.rows + 1) * 8)
            self.stamps = map_array(self.stamps_fd, (self.rows + 1,), np.float64)
        self._fd = new_memfd("scrape-rows", self.rows * NCOL * 8)
        self._block = map_array(self._fd, (self.rows, NCOL), np.float64)
        self._block[:, TOKEN] = -1.0
        self._applied[:] = 0.0  # a new block: versions start again
        return (self._fd, self.stamps_fd)

    def _started(self) -> None:
        os.close(self._fd)  # the child has its own descriptor; the mapping stays
        self._fd = -1
        self._seen_version = -1  # the new child learns the membership from scratch
        self._sync()

    def _drop_block(self) -> None:
        self._block = np.zeros((0, NCOL))
        if self._fd >= 0:  # a spawn that failed
            os.close(self._fd)
            self._fd = -1

    async def stop(self) -> None:
        if self._fallback is not None:
            await self._fallback.stop()
            self._fallback = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.child.stop()
        self._drop_block()
        if self.stamps_fd >= 0:  # the mapping stays (the table may still read it); a later start makes new ones
            os.close(self.stamps_fd)
            self.stamps_fd = -1

    def begin_shutdown(self) -> None:
        """The picker is stopping: a child that ends from now on is not restarted."""
        self.child.begin_shutdown()

    def shared_stamps(self) -> tuple[int, int] | None:
        """(descriptor, length) of the stamps every child writes, for the serving workers to date their rows by;
        None before the first start or scraping in this process (the rows then carry every scrape's time)."""
        return (self.stamps_fd, self.rows + 1) if self.stamps_fd >= 0 and self._fallback is None else None

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
        """For /debug/pool: the child, its restarts, how it last ended (the kit's report)."""
        now = time.monotonic() if now is None else now
        report = self.child.report(now)
        report["up"] = self.up
        return {"mode": "in-process" if self._fallback is not None else "child-process", **report}

    def _child_died(self, code: int) -> None:
        self._drop_block()
        self._rejected_past, self._rejected_now = _sum_counts(self._rejected_past, self._rejected_now), {}
        self._errors_past, self._errors_now = _sum_counts(self._errors_past, self._errors_now), {}

    # -- parent side --------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        table = self.table
        if table.version == self._seen_version or self.child.conn is None:
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
        slots = np.fromiter(members, dtype=np.int64, count=len(members))
        table.follow_stamps(self.stamps, slots, slots)  # the stamps are by our slot
        wanted = {info.address for info, _ in members.values()}
        self._status = {a: s for a, s in self._status.items() if a in wanted}
        for info, _ in members.values():
            self._status.setdefault(
                info.address, EndpointStatus(info.address, self.engines.for_engine(info.engine).name)
            )
        self.child.send(Members([(slot, float(token), info) for slot, (info, token) in members.items()]))

    def apply(self) -> int:
        """Copy consistent, current rows from shared memory into the table; returns how many were applied."""
        self._sync()  # tokens must match the table as it is now, or a reused slot could take the old rows
        n = min(len(self.table.column("present")), self.rows, len(self._block))
        if n == 0:
            return 0
        slots, rows = read_rows(self._block[:n], self._tokens[:n], self._applied[:n])
        if slots.size:
            self.table.write_scrape_rows(slots, rows[:, VALUES], rows[:, OK] > 0, rows[:, FAILURES].astype(np.int64))
            self._applied[slots] = rows[:, VERSION]
        return int(slots.size)

    async def _run(self) -> None:
        """Copy rows in when the child says it wrote some (`Landed`) and sync the membership when the table's
        changes (its listener); a look every `APPLY_SAFETY_S` whatever happens. An idle pool costs a wake-up per
        landed scrape round, not one per tick of a clock."""
        wake = self._wake
        while True:
            await wait_set(wake, APPLY_SAFETY_S)
            wake.clear()
            try:
                self._sync()
                self.apply()
            except Exception:  # the apply loop must outlive any surprise
                log.exception("scrape apply pass failed")

    def _handle(self, msg: Any) -> None:
        if msg.__class__ is Landed:  # copied in now, in the pipe's callback: no task to wake
            try:
                self.apply()
            except Exception:  # the pipe's reader must outlive any surprise; the next pass retries
                log.exception("scrape apply pass failed")
        elif isinstance(msg, Adapters):
            for slot, token, running, waiting in msg.changes:
                if self._tokens[slot] == token:
                    self.table.set_adapters(slot, running, waiting)
        elif isinstance(msg, Status):
            for address, status in msg.statuses.items():
                if address in self._status:
                    self._status[address] = status
            self._rejected_now, self._errors_now = dict(msg.rejected), dict(msg.errors)


def _sum_counts(past: dict[Any, int], now: dict[Any, int]) -> dict[Any, int]:
    out = dict(past)
    for key, count in now.items():
        out[key] = out.get(key, 0) + count
    return out
