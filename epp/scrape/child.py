"""The scrape child (`child_main`, spawned by `epp.scrape.process.ScrapeProcess` through the
child-process kit): the ordinary `ScrapeService` on a private table that mirrors the parent's membership, publishing
changed rows into the parent's block (the shared-row layout, epp.datastore.rows), and the messages
between the two. A row whose new page repeats the values it already carries (an idle server's page) is not
written again and wakes nobody: the child stamps it with the scrape's time in the parent's stamps (one float per
parent slot, epp.datastore.rows), which the parent's table and the workers' read as they read the table; only a
row that changed is written and announced (`Landed`).

Parent → child: `ScrapeStart` (the kit's `Start` payload), `Members` whenever the membership changes (each slot
with a token: a slot reused by another endpoint gets a new one), the kit's `Stop`.
Child → parent: `Status` every `STATUS_S` (per-endpoint statuses and the counters), `Adapters` when an endpoint's
LoRA adapters change, and the kit's Ready, Heartbeat and Log. The child exits when told, when the pipe closes, or
when its parent dies (epp.supervision.child_end).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass

import numpy as np

from epp.datastore.rows import NCOL, SCRAPE_ROW, SCRAPED_AT_VALUE, write_rows, write_stamps
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.scrape.engines import EngineRegistry
from epp.scrape.scraper import EndpointStatus, ScrapeService, ScrapeSettings
from epp.supervision.child_end import ChildEnd
from epp.supervision.loop import run_loop, wait_set
from epp.supervision.memory import map_array
from epp.supervision.messages import Stop
from epp.supervision.pipe import watch_pipe

PUBLISH_S = 0.005  # after a scrape lands, the rest of its round (still under way) gets this long to land too
STATUS_S = 1.0
_BUT_AT = np.arange(len(SCRAPE_ROW)) != SCRAPED_AT_VALUE  # the values a repeated page repeats (not its time)


@dataclass(frozen=True, slots=True)
class ScrapeStart:
    settings: ScrapeSettings
    engines: EngineRegistry
    rows: int  # the block's rows: the parent's slots it scrapes


@dataclass(frozen=True, slots=True)
class Members:
    members: list[tuple[int, float, EndpointInfo]]  # (parent slot, token, endpoint)


@dataclass(frozen=True, slots=True)
class Adapters:
    changes: list[tuple[int, float, list[str], list[str]]]  # (parent slot, token, running, waiting)


@dataclass(frozen=True, slots=True)
class Landed:
    """Rows were written to the block: the parent copies them in now, instead of looking on a clock."""


@dataclass(frozen=True, slots=True)
class Status:
    statuses: dict[str, EndpointStatus]
    rejected: dict[tuple[str, str], int]  # the child's `ScrapeService.rejected_values`
    errors: dict[str, int]  # its `poll_errors`


async def run(end: ChildEnd, block: np.ndarray, stamps: np.ndarray | None = None) -> None:
    start: ScrapeStart = end.payload
    loop = asyncio.get_running_loop()
    table = EndpointTable()
    svc = ScrapeService(table, start.settings, start.engines)
    stop = asyncio.Event()
    landed = asyncio.Event()  # a scrape (or failure) was recorded, the membership changed, or we are to stop
    table.add_scrape_listener(landed.set)

    def finish() -> None:
        stop.set()
        landed.set()

    by_address: dict[str, tuple[int, float]] = {}  # address → (parent slot, token)

    def on_message() -> None:
        nonlocal by_address
        try:
            while end.conn.poll():
                msg = end.conn.recv()
                if isinstance(msg, Members):
                    by_address = {info.address: (slot, token) for slot, token, info in msg.members}
                    table.replace_all(info for _, _, info in msg.members)
                    table.version += 1  # a token may change with the same membership: remap
                    landed.set()
                elif isinstance(msg, Stop):
                    finish()
        except (EOFError, OSError):
            finish()

    watch_pipe(loop, end.conn, on_message)
    end.on_parent_gone(finish, loop)
    await svc.start()
    end.ready()
    beating = asyncio.ensure_future(end.keep_alive())
    status_due = False
    status_timer: asyncio.TimerHandle | None = None

    def status_clock() -> None:  # a Status every STATUS_S: one timer a second, not one per pass
        nonlocal status_due, status_timer
        status_due = True
        landed.set()
        status_timer = loop.call_later(STATUS_S, status_clock)

    status_timer = loop.call_later(STATUS_S, status_clock)
    mapped = -1
    parent = np.zeros(0, dtype=np.int64)
    tokens = np.zeros(0)
    last_values = np.zeros((0, len(SCRAPE_ROW)))
    last_failures = np.zeros(0, dtype=np.int64)
    last_ok = np.zeros(0, dtype=np.bool_)
    adapters: list[tuple[frozenset[str], frozenset[str]] | None] = []
    try:
        while not stop.is_set():
            # Woken by what changed, not by a clock: an idle pool costs a wake-up per scrape round.
            await landed.wait()
            landed.clear()
            if svc.in_flight and not stop.is_set():  # the rest of the round gets PUBLISH_S to land: one pass
                svc.round_done.clear()
                await wait_set(svc.round_done, PUBLISH_S)
            if stop.is_set():
                break
            if status_due:
                status_due = False
                end.send(Status(svc.status(), dict(svc.rejected_values), dict(svc.poll_errors)))
            touched, repeated = table.take_scraped()  # the slots scraped since the last pass: only those are read
            if table.version != mapped:  # membership changed: map local slots to parent rows, republish all
                mapped = table.version
                n = len(table.column("present"))
                parent = np.full(n, -1, dtype=np.int64)
                tokens = np.full(n, -1.0)
                for address, (slot, token) in by_address.items():
                    local = table.slot_of(address)
                    if local is not None:
                        parent[local], tokens[local] = slot, token
                last_values = np.full((n, len(SCRAPE_ROW)), np.nan)
                last_failures = np.full(n, -1, dtype=np.int64)  # never a row's: every row is republished
                last_ok = np.zeros(n, dtype=np.bool_)
                adapters = [None] * n
                touched, repeated = np.flatnonzero(parent >= 0).tolist(), []
            if repeated and stamps is not None:  # pages that repeated the row as published: a stamp, no message
                at = table.column("scraped_at")
                for local in repeated:
                    if local < len(parent) and parent[local] >= 0:
                        stamps[parent[local]] = at[local]
                stamps[-1] += 1.0  # the pass count, after the stamps (epp.datastore.rows)
            elif repeated:
                touched += repeated
            moved = np.array([local for local in touched if local < len(parent) and parent[local] >= 0], np.int64)
            if not moved.size:
                continue
            values, ok, failures = table.scrape_rows(moved)
            before = last_values[moved]
            same = ((values == before) | (np.isnan(values) & np.isnan(before)))[:, _BUT_AT].all(axis=1)
            same &= (failures == last_failures[moved]) & (ok == last_ok[moved])
            if stamps is not None and same.any():  # the page repeated what the row says: a stamp, no message
                write_stamps(stamps, parent[moved[same]], values[same, SCRAPED_AT_VALUE])
            else:
                same[:] = False
            if not same.all():
                changed = moved[~same]
                write_rows(block, parent[changed], tokens[changed], values[~same], ok[~same], failures[~same])
                last_values[changed] = values[~same]
                last_failures[changed] = failures[~same]
                last_ok[changed] = ok[~same]
                end.send(Landed())
            news = []
            for i, local in enumerate(moved.tolist()):
                pair = table.adapters_of(local)
                if ok[i] and adapters[local] != pair:
                    adapters[local] = pair
                    news.append((int(parent[local]), float(tokens[local]), sorted(pair[0]), sorted(pair[1])))
            if news:
                end.send(Adapters(news))
    except (EOFError, OSError):
        pass
    finally:
        if status_timer is not None:
            status_timer.cancel()
        beating.cancel()
        loop.remove_reader(end.conn.fileno())
        await svc.stop()


def child_main(end: ChildEnd) -> int:
    """The kit's entry (epp.supervision.launch)."""
    start: ScrapeStart = end.payload
    block = map_array(end.fds[0], (start.rows, NCOL), np.float64)
    stamps = map_array(end.fds[1], (start.rows + 1,), np.float64) if len(end.fds) > 1 else None
    for fd in end.fds:
        os.close(fd)  # the mappings stay
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(run(end, block, stamps))
    return 0
