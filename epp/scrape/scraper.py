"""The scraper: one async poller per endpoint, writing each page's signals into the endpoint table.

Each endpoint gets its own task and its own kept-alive connection, so a server that hangs only delays itself (its
scrape times out after `timeout_s`; the others keep their pace). The pollers share one clock: a tick every
interval (the interval carries jitter) starts every endpoint's scrape that is due, so an idle picker wakes once
per interval for the whole pool, not once per endpoint, and the round's rows land together (the scrape child
publishes them in one pass). A scrape still running at a tick (a slow endpoint) skips it; a failed scrape backs
off exponentially, up to `backoff_max_s`, counted in ticks. The concurrency bound (`concurrency`) spreads a
large pool's round over as many scrapes at once. The service follows the table's membership
(`EndpointTable.version`), whoever changed it.

A page identical to the endpoint's previous one (an idle server repeats itself) is not decoded or parsed again:
its signals are the previous page's, recorded with this scrape's time.

What a page turns into:
- page parsed, all wanted lines fine: `record_scrape`;
- some wanted lines malformed or duplicated: the signals that parsed are recorded, and the endpoint's status
  carries the problem (partial pages keep what parsed);
- no page (connect/timeout/HTTP error/too large), or a page with problems and no signal at all (binary garbage):
  `record_scrape_failure`; the old values stay and age.
Whether decisions use an endpoint's data is the datastore's `usable` rule (older than `staleness_s`, or
`max_failures` failed scrapes in a row: scorers read it as unknown, the saturation logic as saturated), applied by
each decision at its own `now`; a sweep every interval applies the same rule to report endpoints that turn stale.

What an operator sees: one WARNING line when an endpoint turns unusable, with the reason (`refused`, `timeout`,
`http_error`, `too_large`, `parse_error`, `internal`, `stale`) and the last error, one INFO line when it recovers
(both at most once per 10 s per endpoint, repeats counted), and in each status the last error and since when the
endpoint is unusable (`/debug/pool`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from epp.datastore import Freshness, usable_slots
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.observability.ratelimit import RateLimitedLog
from epp.scrape.engines import EngineRegistry, EngineSpec, Extraction, extract
from epp.scrape.http import HttpConnection, MetricsClient, ScrapeError
from epp.supervision.loop import wait_set

log = logging.getLogger(__name__)

ClientFactory = Callable[[EndpointInfo], MetricsClient]
_Page = tuple[Extraction, bool]  # what a page said: its extraction, and whether it was not valid UTF-8


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    """Scrape tuning; defaults follow upstream (50 ms interval, 1 s timeout)."""

    interval_s: float = 0.05
    timeout_s: float = 1.0
    staleness_s: float = 2.0
    max_failures: int = 3
    max_page_bytes: int = 8 * 1024 * 1024
    concurrency: int = 512  # scrapes in flight at once, all endpoints together
    jitter: float = 0.1  # each interval varies by ±10%
    backoff_max_s: float = 5.0

    @property
    def freshness(self) -> Freshness:
        """The thresholds of the datastore's `usable` rule these settings carry (one set for the whole picker)."""
        return Freshness(self.staleness_s, self.max_failures)

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0 or self.staleness_s <= 0:
            raise ValueError("scrape interval, timeout and staleness threshold must be positive")
        if self.max_failures < 1 or self.concurrency < 1 or self.max_page_bytes < 1:
            raise ValueError("max failures, concurrency and page size limit must be at least 1")


@dataclass(slots=True)
class EndpointStatus:
    """Per endpoint, for /debug/pool and inspect tools: what the last scrape said."""

    address: str
    engine: str
    scrapes: int = 0
    failures: int = 0  # total failed scrapes
    streak: int = 0  # failures in a row
    last_ok_at: float | None = None
    last_error: str | None = None  # None: the last page was clean
    last_error_at: float | None = None
    signals_found: int = 0
    unusable: str | None = None  # why the endpoint's data cannot be used now (FAILURE_REASONS), None: usable
    unusable_since: float | None = None
    recovered_after: float | None = None  # how long the last unusable spell lasted

    def as_dict(self) -> dict[str, object]:
        return {
            "address": self.address,
            "engine": self.engine,
            "scrapes": self.scrapes,
            "failures": self.failures,
            "failure_streak": self.streak,
            "last_ok_at": self.last_ok_at,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "signals_found": self.signals_found,
            "unusable": self.unusable,
            "unusable_since": self.unusable_since,
        }


# Why an endpoint's data cannot be used, in the words its log lines, /debug/pool and metrics use.
# How often the supervisor looks for endpoints gone stale (their verdict and log line); a membership change wakes it
# at once, so new endpoints get their pollers without waiting.
SUPERVISE_S = 0.25
FAILURE_REASONS = ("refused", "timeout", "http_error", "too_large", "parse_error", "internal", "stale")


def failure_reason(problem: str) -> str:
    """The class of a failed scrape, from its error text (epp/scrape/http.py's messages)."""
    p = problem.lower()
    if p.startswith("timed out"):
        return "timeout"
    if p.startswith("connect failed") or p.startswith("connection closed"):
        return "refused"
    if p.startswith("http "):
        return "http_error"
    if p.startswith("page larger") or "too large" in p:
        return "too_large"
    if p.startswith("internal error"):
        return "internal"
    return "parse_error"


def _default_client(info: EndpointInfo) -> MetricsClient:
    return HttpConnection(info.host, info.port, info.metrics_path or "/metrics")


class ScrapeService:
    """Keeps the table's metric columns fresh. `await start()` once the loop runs; `await stop()` on shutdown."""

    def __init__(
        self,
        table: EndpointTable,
        settings: ScrapeSettings | None = None,
        engines: EngineRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        client_factory: ClientFactory = _default_client,
        seed: int | None = None,
    ) -> None:
        self.table = table
        self.settings = settings or ScrapeSettings()
        self.engines = engines or EngineRegistry()
        self._clock = clock
        self._client_factory = client_factory
        self._rng = random.Random(seed)
        self._pollers: dict[str, tuple[EndpointInfo, asyncio.Task[None]]] = {}
        self._status: dict[str, EndpointStatus] = {}
        self._seen_version = -1
        self._supervisor: asyncio.Task[None] | None = None
        self._members_changed = asyncio.Event()
        table.add_membership_listener(self._members_changed.set)
        # The concurrency bound: free places, and the scrapes waiting for one (each handed a place as one ends).
        self._free = self.settings.concurrency
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiting: list[asyncio.Future[None]] = []  # a future per poller waiting for the next tick
        self._ticker: asyncio.TimerHandle | None = None
        self.in_flight = 0  # scrapes under way now
        self.round_done = asyncio.Event()  # set when the last scrape under way ends (a reader clears it)
        self.rejected_values: dict[tuple[str, str], int] = {}  # (signal, reason) → scraped values refused
        self.poll_errors: dict[str, int] = {}  # failure reason → failed scrapes
        # An endpoint flapping every few seconds gets one line per transition at most every 10 s.
        self._transitions = RateLimitedLog(log, every_s=10.0, clock=clock)
        self._logged: dict[str, str | None] = {}  # address → the state its last logged line said (None: usable)
        self._unusable_detail: dict[str, str] = {}

    # -- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._supervisor is not None:
            return
        self.sync()
        self._supervisor = asyncio.create_task(self._supervise(), name="scrape-supervisor")
        self._next_tick()

    async def stop(self) -> None:
        tasks = [task for _, task in self._pollers.values()]
        if self._supervisor is not None:
            tasks.append(self._supervisor)
            self._supervisor = None
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pollers.clear()

    def status(self) -> dict[str, EndpointStatus]:
        return dict(self._status)

    # -- membership -------------------------------------------------------------------------------------------

    def sync(self) -> None:
        """Start pollers for new endpoints, stop those of removed ones, restart changed ones (engine, path)."""
        table = self.table
        if table.version == self._seen_version:
            return
        self._seen_version = table.version
        wanted: dict[str, EndpointInfo] = {}
        for address in table.addresses():
            slot = table.slot_of(address)
            info = table.info(slot) if slot is not None else None
            if info is not None:
                wanted[address] = info
        for address in [a for a, (info, _) in self._pollers.items() if wanted.get(a) != info]:
            _, task = self._pollers.pop(address)
            task.cancel()
            if address not in wanted:
                self._status.pop(address, None)
                self._logged.pop(address, None)
                self._unusable_detail.pop(address, None)
        for address, info in wanted.items():
            if address not in self._pollers:
                engine = self.engines.for_engine(info.engine).name
                self._status.setdefault(address, EndpointStatus(address, engine)).engine = engine
                task = asyncio.create_task(self._poll(info), name=f"scrape {address}")
                self._pollers[address] = (info, task)

    async def _supervise(self) -> None:
        s = self.settings
        changed = self._members_changed
        while True:
            await wait_set(changed, SUPERVISE_S)
            changed.clear()
            self.sync()
            now = self._clock()
            snap = self.table.view()
            usable = usable_slots(snap, now, s.freshness)  # the rule decisions apply
            for slot in snap.slots[~usable[snap.slots]].tolist():
                status = self._status.get(snap.addresses[slot])
                # Only endpoints that had a page: one never scraped yet is not news (its failures are, below).
                if status is not None and status.unusable is None and status.last_ok_at is not None:
                    detail = f"no page for {now - status.last_ok_at:.1f}s"
                    self._turn_unusable(status, "stale", detail, now)
            self._log_pending(now)

    # -- usable / unusable ------------------------------------------------------------------------------------

    def _turn_unusable(self, st: EndpointStatus, reason: str, detail: str, now: float) -> None:
        st.unusable, st.unusable_since = reason, now
        self._unusable_detail[st.address] = detail
        self._log_state(st, now)

    def _turn_usable(self, st: EndpointStatus, now: float) -> None:
        st.recovered_after = now - st.unusable_since if st.unusable_since is not None else None
        st.unusable = st.unusable_since = None
        self._log_state(st, now)

    def _log_state(self, st: EndpointStatus, now: float) -> None:
        """One line per change of state, at most one per direction per 10 s per endpoint; a change held back is
        logged by a later sweep (`_log_pending`), so the log never ends on a state the endpoint has left."""
        address = st.address
        if st.unusable == self._logged.get(address):
            return
        if st.unusable is not None:
            logged = self._transitions.log(
                (address, "down"),
                logging.WARNING,
                "endpoint %s unusable: %s (%s); scores treat it as unknown",
                address,
                st.unusable,
                self._unusable_detail.get(address, ""),
            )
        else:
            was = self._logged.get(address)
            after = f" after {st.recovered_after:.1f}s" if st.recovered_after is not None else ""
            logged = self._transitions.log(
                (address, "up"), logging.INFO, "endpoint %s usable again%s (was: %s)", address, after, was
            )
        if logged:
            self._logged[address] = st.unusable

    def _log_pending(self, now: float) -> None:
        for address, st in self._status.items():
            if st.unusable != self._logged.get(address):
                self._log_state(st, now)

    # -- one endpoint -----------------------------------------------------------------------------------------

    def _next_tick(self) -> None:
        """The pool's one clock, a timer callback (no task to wake): every interval (± jitter), every poller
        waiting for a tick starts its scrape."""
        s = self.settings
        delay = s.interval_s * (1 + s.jitter * self._rng.uniform(-1, 1))
        self._ticker = asyncio.get_running_loop().call_later(delay, self._on_tick)

    def _on_tick(self) -> None:
        waiting, self._waiting = self._waiting, []
        for tick in waiting:  # every poller waiting starts (one whose task was cancelled meanwhile is skipped)
            if not tick.done():
                tick.set_result(None)
        self._next_tick()

    async def _wait_place(self) -> None:
        """Wait for a place under the concurrency bound, handed over by `_release` (a large pool's round)."""
        place = asyncio.get_running_loop().create_future()
        self._queue.append(place)
        try:
            await place
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():  # handed a place as we were cancelled: pass it on
                self._release()
            raise

    def _release(self) -> None:
        queue = self._queue
        while queue:
            place = queue.popleft()
            if not place.done():  # a waiter cancelled meanwhile is skipped
                place.set_result(None)
                return
        self._free += 1

    async def _poll(self, info: EndpointInfo) -> None:
        s = self.settings
        engine = self.engines.for_engine(info.engine)
        status = self._status.setdefault(info.address, EndpointStatus(info.address, engine.name))
        client = self._client_factory(info)
        loop = asyncio.get_running_loop()
        skip = 0  # ticks left to wait out after a failure (the backoff, in intervals)
        last: tuple[bytes, _Page] | None = None  # the previous page and what it said
        try:
            while True:
                tick = loop.create_future()
                self._waiting.append(tick)
                await tick
                if skip:
                    skip -= 1
                    continue
                self.in_flight += 1
                try:
                    if self._free and not self._queue:  # a place under the bound, taken with no await
                        self._free -= 1
                    else:
                        await self._wait_place()
                    try:
                        ok, last = await self._scrape_once(info, engine, client, status, last)
                    finally:
                        self._release()
                finally:
                    self.in_flight -= 1
                    if not self.in_flight:
                        self.round_done.set()
                if not ok:  # back off: 2, 4, 8 … intervals (± jitter), at most backoff_max_s
                    backoff = min(s.backoff_max_s, s.interval_s * 2 ** min(status.streak, 16))
                    skip = max(0, round(backoff * (1 + s.jitter * self._rng.uniform(-1, 1)) / s.interval_s) - 1)
        finally:
            client.close()

    async def _scrape_once(
        self,
        info: EndpointInfo,
        engine: EngineSpec,
        client: MetricsClient,
        st: EndpointStatus,
        last: tuple[bytes, _Page] | None,
    ) -> tuple[bool, tuple[bytes, _Page] | None]:
        """One scrape; (whether it gave a page, the page and what it said, for the next scrape to compare)."""
        s = self.settings
        st.scrapes += 1
        problem: str
        repeat = False
        try:
            body = await client.get(s.timeout_s, s.max_page_bytes)
            if last is not None and body == last[0]:  # the same bytes say the same: no decode, no parse
                result, bad_utf8 = last[1]
                repeat = st.streak == 0  # and the table's row holds what they said (unless reset: record_repeat)
            else:
                try:
                    text, bad_utf8 = body.decode("utf-8"), False
                except UnicodeDecodeError:  # keep what parses; binary garbage ends with no signal and fails below
                    text, bad_utf8 = body.decode("utf-8", errors="replace"), True
                result = extract(text, engine)
                last = (body, (result, bad_utf8))
        except ScrapeError as exc:
            problem = str(exc)
        except Exception as exc:  # a bug or a surprise must cost one scrape, never the poller
            log.exception("scrape of %s failed unexpectedly", info.address)
            problem = f"internal error: {type(exc).__name__}: {exc}"
        else:
            problems = list(result.problems)
            for key in result.rejected:
                self.rejected_values[key] = self.rejected_values.get(key, 0) + 1
            if bad_utf8:
                problems.insert(0, "page is not valid UTF-8")
            if result.signals_found or not problems:
                slot = self.table.slot_of(info.address)
                if slot is None:
                    return True, last  # removed meanwhile; sync() cancels this poller
                now = self._clock()
                if not (repeat and self.table.record_repeat(slot, now)):
                    self.table.record_scrape(slot, result.sample, now)
                st.streak = 0
                st.last_ok_at = now
                st.signals_found = result.signals_found
                st.last_error = "; ".join(problems[:3]) if problems else None
                if problems:
                    st.last_error_at = now
                if st.unusable is not None:
                    self._turn_usable(st, now)
                if not result.signals_found and st.scrapes == 1:
                    log.warning("%s: page has none of engine %r's metrics", info.address, engine.name)
                return True, last
            problem = "; ".join(problems[:3])
        slot = self.table.slot_of(info.address)
        st.failures += 1
        st.streak += 1
        st.last_error = problem
        st.last_error_at = now = self._clock()
        reason = failure_reason(problem)
        self.poll_errors[reason] = self.poll_errors.get(reason, 0) + 1
        if slot is not None:
            self.table.record_scrape_failure(slot)
        if st.streak == 1:
            log.debug("scrape of %s failed: %s", info.address, problem)
        if st.streak >= s.max_failures and st.unusable is None:
            self._turn_unusable(st, reason, f"{st.streak} failed scrapes in a row, last: {problem}", now)
        return False, last
