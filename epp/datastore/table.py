"""The endpoint table: one row per endpoint, one numpy column per signal.

Scrapers write a row; the scheduler reads whole columns, so a pick costs a handful of vector operations whatever the
number of endpoints. Rows live in stable slots: an endpoint keeps its slot while it exists, and a freed slot is
reused by the next endpoint added, so columns never need compacting. Every writer runs on the event loop and no
writer awaits half-way, so a reader on the loop always sees whole rows; `snapshot()` copies the columns for readers
that keep them across an await (or run elsewhere, like the virtual-time benchmark), and `view()` hands a reader that
finishes before its next await (a decision) read-only views instead, with no copy.

Unknown values are NaN, never zero: an engine that does not export KV-cache usage must not look idle.
Time is always an argument (`now`, seconds on a monotonic clock): this module reads no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from epp.datastore.rows import SCRAPE_ROW, SCRAPED_AT_VALUE

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

NAN = math.nan


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """Who an endpoint is, as its source (pod watch, static list, site registry) describes it."""

    address: str  # "ip:port", the value written into x-gateway-destination-endpoint
    engine: str = "vllm"
    labels: Mapping[str, str] = field(default_factory=dict)
    pod_name: str = ""
    metrics_path: str = "/metrics"
    # The pool it belongs to (`namespace/name`) when the picker serves several pools; "" with one pool.
    pool: str = ""

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


@dataclass(slots=True)
class MetricsSample:
    """One scrape's signals for one endpoint. NaN (or None for lists) means the page did not say."""

    waiting: float = NAN
    running: float = NAN
    kv_usage: float = NAN  # 0..1
    max_lora: float = NAN
    block_size: float = NAN
    num_blocks: float = NAN
    running_adapters: tuple[str, ...] | None = None
    waiting_adapters: tuple[str, ...] | None = None


# The order of these tuples is the row order of the blocks; `snapshot()` indexes rows by position.
_FLOAT_COLUMNS = SCRAPE_ROW  # the float block's rows are a shared row's values, in order (`scrape_rows`)
_INT_COLUMNS = ("scrape_failures", "inflight", "picks_since_scrape", "inflight_tokens", "prefill_tokens")
_BOOL_COLUMNS = ("present", "scrape_ok")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The table's columns, indexed by slot (length = the table's high-water mark): a consistent copy from
    `EndpointTable.snapshot()`, or read-only live views from `EndpointTable.view()`.

    `present[slot]` tells whether a slot holds an endpoint; `addresses[slot]` is "" for a free slot.
    """

    version: int
    addresses: tuple[str, ...]
    infos: tuple[EndpointInfo | None, ...]
    present: BoolArray
    waiting: FloatArray
    running: FloatArray
    kv_usage: FloatArray
    max_lora: FloatArray
    block_size: FloatArray
    num_blocks: FloatArray
    scraped_at: FloatArray  # NaN until the first successful scrape
    scrape_ok: BoolArray
    scrape_failures: IntArray
    inflight: IntArray  # the picker's own picks that have not completed
    picks_since_scrape: IntArray  # own picks since the endpoint's last scrape: load the metrics cannot show yet
    inflight_tokens: IntArray  # prompt tokens of the picker's own picks that have not completed (estimated)
    # uncached prompt tokens of the picker's own picks whose first response byte has not come: the prefill they
    # queue there (booked at the pick with what the prefix producers found cached, released at the first byte)
    prefill_tokens: IntArray
    running_adapters: tuple[frozenset[str], ...]
    waiting_adapters: tuple[frozenset[str], ...]
    # `slots`, when the builder already knows it (the table's cached view); None: computed from `present`.
    slot_index: IntArray | None = None

    @property
    def slots(self) -> IntArray:
        """The slots that hold an endpoint, ascending."""
        if self.slot_index is not None:
            return self.slot_index
        return np.flatnonzero(self.present)

    def effective_queue(self) -> FloatArray:
        """Per slot, last scraped `waiting` + the picker's own picks since that scrape (NaN where waiting is
        unknown): the queue as it is now, which the next scrape would show."""
        return self.waiting + self.picks_since_scrape


class EndpointTable:
    """Endpoints of one pool, struct-of-arrays. Not thread-safe: all writers run on one event loop."""

    def __init__(self, initial_capacity: int = 64) -> None:
        self._capacity = max(1, initial_capacity)
        self._high_water = 0
        self._free: list[int] = []
        self._slot_of: dict[str, int] = {}
        self._infos: list[EndpointInfo | None] = []
        self._running_adapters: list[frozenset[str]] = []
        self._waiting_adapters: list[frozenset[str]] = []
        # One 2-D block per dtype (a row per column name): a snapshot is three copies, not fifteen.
        self._floats = np.full((len(_FLOAT_COLUMNS), self._capacity), NAN)
        self._ints = np.zeros((len(_INT_COLUMNS), self._capacity), dtype=np.int64)
        self._bools = np.zeros((len(_BOOL_COLUMNS), self._capacity), dtype=np.bool_)
        self._cols: dict[str, np.ndarray] = {}
        self._counts: dict[str, memoryview] = {}
        self._bind_columns()
        self.version = 0  # bumps on every membership change
        self.scrape_version = 0  # bumps on every recorded scrape or failure: a reader can skip an unchanged table
        self._scraped_slots: set[int] = set()  # slots with a scrape or failure recorded since `take_scraped`
        self._repeated_slots: set[int] = set()  # slots with a repeated page recorded since then (`record_repeat`)
        self._scrape_listeners: list[Callable[[], None]] = []
        self._membership_listeners: list[Callable[[], None]] = []
        self._members_cache: tuple[int, tuple[str, ...], tuple[EndpointInfo | None, ...]] | None = None
        self._adapters_cache: tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]] | None = None
        self._view_cache: tuple[tuple[int, int, int], object, Snapshot] | None = None
        self.synced = False  # the endpoint source has delivered its first complete view
        # stamps (epp.datastore.rows): (the array, our slots, their index in it, the pass count last read)
        self._stamps: tuple[FloatArray, IntArray, IntArray] | None = None
        self._stamps_seen = -1.0

    # -- membership -------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, address: object) -> bool:
        return address in self._slot_of

    def addresses(self) -> list[str]:
        return list(self._slot_of)

    def slot_of(self, address: str) -> int | None:
        return self._slot_of.get(address)

    def info(self, slot: int) -> EndpointInfo | None:
        return self._infos[slot] if 0 <= slot < self._high_water else None

    def members(self, rows: int) -> tuple[list[tuple[int, EndpointInfo]], bool]:
        """(slot, info) of every endpoint whose slot is below `rows`, and whether any lay beyond: what a
        fixed-size shared block (the scrape child's, the workers') can carry of the table."""
        within: list[tuple[int, EndpointInfo]] = []
        beyond = False
        for slot in self._slot_of.values():
            info = self.info(slot)
            if info is None:
                continue
            if slot >= rows:
                beyond = True
                continue
            within.append((slot, info))
        return within, beyond

    def upsert(self, info: EndpointInfo) -> int:
        """Add an endpoint, or update its description (engine, labels) keeping its slot and metrics."""
        slot = self._slot_of.get(info.address)
        if slot is not None:
            if self._infos[slot] != info:
                self._infos[slot] = info
                self._membership_changed()
            return slot
        slot = self._free.pop() if self._free else self._next_slot()
        self._slot_of[info.address] = slot
        self._infos[slot] = info
        self._reset_row(slot)
        self._cols["present"][slot] = True
        self._membership_changed()
        return slot

    def remove(self, address: str) -> bool:
        slot = self._slot_of.pop(address, None)
        if slot is None:
            return False
        self._infos[slot] = None
        self._reset_row(slot)
        self._free.append(slot)
        self._membership_changed()
        return True

    def replace_all(self, infos: Iterable[EndpointInfo]) -> tuple[int, int]:
        """Make the table hold exactly these endpoints (a source's full view); returns (added, removed)."""
        wanted = {i.address: i for i in infos}
        removed = [a for a in self._slot_of if a not in wanted]
        for address in removed:
            self.remove(address)
        added = sum(1 for a in wanted if a not in self._slot_of)
        for info in wanted.values():
            self.upsert(info)
        return added, len(removed)

    def _next_slot(self) -> int:
        if self._high_water == self._capacity:
            self._grow()
        slot = self._high_water
        self._high_water += 1
        self._infos.append(None)
        self._running_adapters.append(frozenset())
        self._waiting_adapters.append(frozenset())
        return slot

    def _grow(self) -> None:
        new_capacity = self._capacity * 2
        old = self._capacity
        floats = np.full((len(_FLOAT_COLUMNS), new_capacity), NAN)
        ints = np.zeros((len(_INT_COLUMNS), new_capacity), dtype=np.int64)
        bools = np.zeros((len(_BOOL_COLUMNS), new_capacity), dtype=np.bool_)
        floats[:, :old] = self._floats
        ints[:, :old] = self._ints
        bools[:, :old] = self._bools
        self._floats, self._ints, self._bools = floats, ints, bools
        self._capacity = new_capacity
        self._bind_columns()

    def _bind_columns(self) -> None:
        """Name each row of the blocks: `self._cols["waiting"]` is a view into the float block."""
        for block, names in ((self._floats, _FLOAT_COLUMNS), (self._ints, _INT_COLUMNS), (self._bools, _BOOL_COLUMNS)):
            for i, name in enumerate(names):
                self._cols[name] = block[i]
        # The int rows again as memoryviews (the same memory): the per-pick bookings' cheap element access.
        self._counts = {name: memoryview(self._ints[i]) for i, name in enumerate(_INT_COLUMNS)}

    def _reset_row(self, slot: int) -> None:
        self._floats[:, slot] = NAN
        self._ints[:, slot] = 0
        self._bools[:, slot] = False
        self._running_adapters[slot] = frozenset()
        self._waiting_adapters[slot] = frozenset()
        self._adapters_cache = None

    # -- writers ----------------------------------------------------------------------------------------------

    def add_scrape_listener(self, listener: Callable[[], None]) -> None:
        """Called (synchronously, cheaply) after every recorded scrape or failure: flow control's dispatch task
        re-evaluates the pool on new data instead of polling."""
        self._scrape_listeners.append(listener)

    def add_membership_listener(self, listener: Callable[[], None]) -> None:
        """Called (synchronously, cheaply) after every membership change (an endpoint added, removed or described
        anew): the control process's scrape and publication passes wake for it instead of polling the version."""
        self._membership_listeners.append(listener)

    def _membership_changed(self) -> None:
        self.version += 1
        for listener in self._membership_listeners:
            listener()

    def _scraped(self) -> None:
        for listener in self._scrape_listeners:
            listener()

    def take_scraped(self) -> tuple[list[int], list[int]]:
        """Since the last call, in no order: the slots that had a scrape or a failed scrape recorded
        (`record_scrape`, `record_scrape_failure`), and those that had only repeated pages (`record_repeat`): what
        a publisher of changed rows (the scrape child) looks at instead of the whole table. A slot removed
        meanwhile may be among them."""
        scraped, self._scraped_slots = self._scraped_slots, set()
        repeated, self._repeated_slots = self._repeated_slots, set()
        return list(scraped), [slot for slot in repeated if slot not in scraped]

    def scrape_rows(self, slots: IntArray) -> tuple[FloatArray, BoolArray, IntArray]:
        """The live `SCRAPE_ROW` values of `slots` (one row each, copied), their `scrape_ok` and
        `scrape_failures`: a few rows read without a snapshot of the whole table."""
        return self._floats[:, slots].T, self._cols["scrape_ok"][slots], self._cols["scrape_failures"][slots]

    def adapters_of(self, slot: int) -> tuple[frozenset[str], frozenset[str]]:
        """The running and waiting LoRA adapters the last page of `slot` listed."""
        return self._running_adapters[slot], self._waiting_adapters[slot]

    def record_scrape(self, slot: int, sample: MetricsSample, now: float) -> None:
        self.scrape_version += 1
        self._scraped_slots.add(slot)
        c = self._cols
        c["waiting"][slot] = sample.waiting
        c["running"][slot] = sample.running
        c["kv_usage"][slot] = sample.kv_usage
        c["max_lora"][slot] = sample.max_lora
        c["block_size"][slot] = sample.block_size
        c["num_blocks"][slot] = sample.num_blocks
        c["scraped_at"][slot] = now
        c["scrape_ok"][slot] = True
        c["scrape_failures"][slot] = 0
        c["picks_since_scrape"][slot] = 0
        running = frozenset(sample.running_adapters or ())
        waiting = frozenset(sample.waiting_adapters or ())
        if running != self._running_adapters[slot] or waiting != self._waiting_adapters[slot]:
            self._running_adapters[slot] = running
            self._waiting_adapters[slot] = waiting
            self._adapters_cache = None
        if self._scrape_listeners:
            self._scraped()

    def record_repeat(self, slot: int, now: float) -> bool:
        """The endpoint's page said again what its last recorded scrape said: `record_scrape` with that sample,
        which writes only the time (and restarts the picks since the scrape, as a fresh page does). False, with
        nothing recorded, where the row is not that scrape's any more (a failure since, or the row reset): the
        caller records the page whole."""
        c = self._cols
        if not c["scrape_ok"][slot] or c["scrape_failures"][slot]:
            return False
        self.scrape_version += 1
        self._repeated_slots.add(slot)
        c["scraped_at"][slot] = now
        c["picks_since_scrape"][slot] = 0
        if self._scrape_listeners:
            self._scraped()
        return True

    def record_scrape_failure(self, slot: int) -> int:
        """Count a failed scrape; the old values stay (they age into staleness). Returns the failure streak."""
        self.scrape_version += 1
        self._scraped_slots.add(slot)
        self._cols["scrape_ok"][slot] = False
        self._cols["scrape_failures"][slot] += 1
        if self._scrape_listeners:
            self._scraped()
        return int(self._cols["scrape_failures"][slot])

    def write_scrape_rows(self, slots: IntArray, floats: FloatArray, ok: BoolArray, failures: IntArray) -> None:
        """Vectorised `record_scrape`/`record_scrape_failure` for rows scraped elsewhere (a scrape process).

        `floats` has one row per slot and the columns of `SCRAPE_ROW` (the shared-row layout, epp.datastore.rows).
        Rows whose `scraped_at` moved forward are fresh pages: their in-flight-since-scrape count restarts.
        Adapters go separately (`set_adapters`): they change rarely and are strings.
        """
        if not len(slots):
            return
        self.scrape_version += 1
        fresh = floats[:, SCRAPED_AT_VALUE] > np.nan_to_num(self._cols["scraped_at"][slots], nan=-np.inf)
        for i, name in enumerate(SCRAPE_ROW):
            self._cols[name][slots] = floats[:, i]
        self._cols["scrape_ok"][slots] = ok
        self._cols["scrape_failures"][slots] = failures
        self._cols["picks_since_scrape"][slots[fresh]] = 0
        if self._scrape_listeners:
            self._scraped()

    def set_adapters(self, slot: int, running: Iterable[str], waiting: Iterable[str]) -> None:
        r, w = frozenset(running), frozenset(waiting)
        if r != self._running_adapters[slot] or w != self._waiting_adapters[slot]:
            self._running_adapters[slot] = r
            self._waiting_adapters[slot] = w
            self._adapters_cache = None

    def book_pick(self, slot: int, tokens: int = 0, prefill: int = 0) -> None:
        """A pick in flight on `slot` with its `tokens`; `prefill`: its uncached tokens booked too, as
        `book_prefill` books them (one call per decision instead of two)."""
        # Through memoryviews of the int rows (`_counts`): read and written as Python ints, where numpy's
        # `item` and item assignment cost ~600 instructions a pair (`column[slot] += 1`, a numpy scalar: ~1k more)
        # (benchmarks/stream_path.py --instructions).
        c = self._counts
        c["inflight"][slot] += 1
        c["picks_since_scrape"][slot] += 1
        if tokens:
            c["inflight_tokens"][slot] += tokens
        if prefill:
            c["prefill_tokens"][slot] += prefill

    def release_pick(self, slot: int, tokens: int = 0, prefill: int = 0) -> None:
        """`book_pick`'s booking ends; `prefill`: its prefill tokens released too, as `release_prefill` does."""
        c = self._counts  # memoryviews: Python ints, as `book_pick`
        inflight = c["inflight"]
        count = inflight[slot]
        if count > 0:
            inflight[slot] = count - 1
        if tokens:
            held = c["inflight_tokens"]
            held[slot] = max(0, held[slot] - tokens)
        if prefill:
            held = c["prefill_tokens"]
            held[slot] = max(0, held[slot] - prefill)

    def book_prefill(self, slot: int, tokens: int) -> None:
        """A pick's uncached prompt tokens: prefill queued on `slot` until its first response byte
        (`release_prefill`). This process's own: serving workers do not share it (`set_bookings`)."""
        held = self._cols["prefill_tokens"]
        held[slot] = held.item(slot) + tokens

    def release_prefill(self, slot: int, tokens: int) -> None:
        held = self._cols["prefill_tokens"]
        held[slot] = max(0, held.item(slot) - tokens)

    def set_bookings(self, slots: IntArray, totals: IntArray) -> None:
        """Bookings made elsewhere (serving workers, each in its own row of a shared matrix), summed: one row per
        slot of (picks in flight, picks since the last scrape, tokens in flight)."""
        self._cols["inflight"][slots] = totals[:, 0]
        self._cols["picks_since_scrape"][slots] = totals[:, 1]
        self._cols["inflight_tokens"][slots] = totals[:, 2]

    def follow_stamps(self, stamps: FloatArray | None, slots: IntArray, sources: IntArray) -> None:
        """Date `slots` from `stamps[sources]` too (a writer's stamps, epp.datastore.rows): the time of a scrape
        that repeated the values a row already holds. Read as the table is read (`view`, `snapshot`), when the
        stamps' pass count moved: a newer stamp moves `scraped_at` on and, as a fresh page does, restarts the
        row's picks since the scrape. A row never scraped (NaN) takes no stamp: a stamp vouches for values."""
        self._stamps = None if stamps is None else (stamps, slots, sources)
        self._stamps_seen = -1.0

    def _take_stamps(self, stamps: FloatArray, slots: IntArray, sources: IntArray) -> None:
        count = stamps[-1]
        if count == self._stamps_seen:
            return
        self._stamps_seen = count
        at = stamps[sources]
        newer = at > self._cols["scraped_at"][slots]  # NaN on either side: False
        if newer.any():
            moved = slots[newer]
            self._cols["scraped_at"][moved] = at[newer]
            self._cols["picks_since_scrape"][moved] = 0
            self.stamped(sources[newer])

    def stamped(self, sources: IntArray) -> None:
        """Rows dated by stamps (their index in the stamps): a subclass that mirrors picks elsewhere resets them."""

    # -- readers ----------------------------------------------------------------------------------------------

    def column(self, name: str) -> np.ndarray:
        """A live view of one column up to the high-water mark (valid until the next await)."""
        return self._cols[name][: self._high_water]

    def snapshot(self) -> Snapshot:
        """Copies of every column; the per-slot tuples are rebuilt only when membership or adapters change."""
        if self._stamps is not None:
            self._take_stamps(*self._stamps)
        members, adapters = self._members(), self._adapters()
        n = self._high_water
        return self._assemble(
            members, adapters, self._floats[:, :n].copy(), self._ints[:, :n].copy(), self._bools[:, :n].copy()
        )

    def view(self) -> Snapshot:
        """The table as a Snapshot of read-only *views*: the live values, with no copy.

        For a reader that is done before the table can change, i.e. before its next await (the director's
        decision, synchronous from snapshot to booking). It saves the three copies and the Snapshot built per
        request: the object is rebuilt only when membership, adapters or the blocks' size change, and between
        rebuilds its columns show the current values. Writing through it raises (the views are read-only), so a
        plugin that forgets a column is shared cannot corrupt the table.
        """
        if self._stamps is not None:
            self._take_stamps(*self._stamps)
        key = (self.version, self._high_water, self._capacity)
        cached = self._view_cache
        # Same membership and size, adapters not rebuilt (a change drops `_adapters_cache`): the view still holds.
        if cached is not None and cached[0] == key and cached[1] is self._adapters_cache:
            return cached[2]
        members, adapters = self._members(), self._adapters()
        n = self._high_water
        floats, ints, bools = self._floats[:, :n], self._ints[:, :n], self._bools[:, :n]
        slots = np.flatnonzero(bools[0])
        for array in (floats, ints, bools, slots):
            array.flags.writeable = False  # on these views only: the table's own blocks stay writable
        view = self._assemble(members, adapters, floats, ints, bools, slot_index=slots)
        self._view_cache = (key, adapters, view)
        return view

    def _members(self) -> tuple[int, tuple[str, ...], tuple[EndpointInfo | None, ...]]:
        n = self._high_water
        members = self._members_cache
        if members is None or members[0] != self.version or len(members[1]) != n:
            infos = tuple(self._infos[:n])
            members = (self.version, tuple(i.address if i is not None else "" for i in infos), infos)
            self._members_cache = members
        return members

    def _adapters(self) -> tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]]:
        n = self._high_water
        adapters = self._adapters_cache
        if adapters is None or len(adapters[0]) != n:
            adapters = (tuple(self._running_adapters[:n]), tuple(self._waiting_adapters[:n]))
            self._adapters_cache = adapters
        return adapters

    def _assemble(
        self,
        members: tuple[int, tuple[str, ...], tuple[EndpointInfo | None, ...]],
        adapters: tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]],
        floats: FloatArray,
        ints: IntArray,
        bools: BoolArray,
        slot_index: IntArray | None = None,
    ) -> Snapshot:
        return Snapshot(
            version=self.version,
            addresses=members[1],
            infos=members[2],
            present=bools[0],
            waiting=floats[0],
            running=floats[1],
            kv_usage=floats[2],
            max_lora=floats[3],
            block_size=floats[4],
            num_blocks=floats[5],
            scraped_at=floats[6],
            scrape_ok=bools[1],
            scrape_failures=ints[0],
            inflight=ints[1],
            picks_since_scrape=ints[2],
            inflight_tokens=ints[3],
            prefill_tokens=ints[4],
            running_adapters=adapters[0],
            waiting_adapters=adapters[1],
            slot_index=slot_index,
        )
