"""The control process's endpoint table as one serving worker sees it (epp.app.worker).

The rows come from the shared-row block the control process writes (epp.datastore.rows, by its slot, seqlocked);
the in-flight matrix has one row per worker and one column per control slot, each worker writing only its own row
as it books and releases picks, every worker reading the sum; the stamps date rows whose page repeated itself
without rewriting them. A worker's slots are its own (its table is rebuilt from the membership the control process
sends), so the mirror keeps both maps: control slot to ours, ours to control.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from epp.app.pick_log import NATIVE, Kernels
from epp.datastore.rows import FAILURES, NCOL, OK, SCRAPED_AT, VALUES, VERSION, read_rows
from epp.datastore.table import EndpointInfo, EndpointTable, Snapshot

INFLIGHT, PICKS, TOKENS = 0, 1, 2  # the in-flight matrix's columns: picks in flight, picks since scrape, tokens
MATRIX_COLUMNS = 3
# Cells (workers × endpoints × columns) up to which the bookings are summed on Python ints (`_sum_cells`): a refresh
# of a small pool then costs ~2 µs, not the ~12 µs of numpy's fancy index, sum and three scatters on tiny arrays.
SMALL_CELLS = 192
# The table's own booking and view, called by name where a worker's adds to them: `super()` builds an object per call.
_table_book, _table_release, _table_view = EndpointTable.book_pick, EndpointTable.release_pick, EndpointTable.view


class MirrorTable(EndpointTable):
    """The control process's endpoint table as one worker sees it, with every worker's picks in flight summed."""

    def __init__(
        self,
        rows: np.ndarray,
        inflight: np.ndarray,
        me: int,
        stamps: np.ndarray | None = None,
        native: Kernels | None = NATIVE,
    ) -> None:
        super().__init__()
        self._native = native  # None: `_sum_cells` runs in Python (a test holds the two equal)
        self._rows = rows
        self._stamp_array = stamps  # by control slot (epp.datastore.rows): dates rows whose page repeated itself
        self._matrix = inflight
        self._me = me
        # Our row of the matrix as Python ints (a flat memoryview): a booking's three counts cost ~0.3 µs, not the
        # ~3 µs of numpy scalars. The block is one contiguous mapping.
        self._cells = inflight.data.cast("B").cast("q")
        self._stride = inflight.shape[1] * MATRIX_COLUMNS  # cells of one worker's row
        self._base = me * self._stride
        self._end = inflight.shape[0] * self._stride  # cells of every worker's row
        self._small: list[tuple[int, int]] | None = []  # (our slot, control slot's first cell): a small pool's pairs
        self._control_of: list[int] = []  # our slot → control slot (-1: none), as Python ints
        self._bind_cells()
        self._named: list[tuple[float, int]] = []  # control slot → (its token, our slot), as Python numbers
        # Our slot → (the control process's slot, its token), or None: how a shared record names our pick's
        # endpoint, made once per membership so that a pick's record costs a list index, not a method call.
        self.names: list[tuple[int, int] | None] = []
        # (control slot, its token) → our slot, for every endpoint we hold: how a shared record's endpoint is found
        # (`local_of`; `_learn` reads it once per refresh and looks each record up itself, without a call).
        self.by_name: dict[tuple[int, int], int] = {}
        # The rows' versions when last read (unchanged: no row was written since), read through a flat memoryview
        # of the row block: a strided slice and a list, ~0.5k instructions where numpy's slice and bytes took ~2.6k.
        self._versions: Sequence[float] = []
        self._row_words = rows.data.cast("B").cast("d")
        n = rows.shape[0]
        self._tokens = np.full(n, -1.0)
        self._applied = np.zeros(n)
        self._local = np.full(n, -1, dtype=np.int64)  # control slot → our slot
        self._control = np.zeros(0, dtype=np.int64)  # our slot → control slot (-1: none)
        self._high = 0
        self._pairs = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))  # (our slots, control slots)
        inflight[me] = 0
        # Called as a decision reads the table (`view`), before it does: the worker refreshes it there when it is
        # older than its refresh period (epp.app.worker), so no timer has to keep it fresh.
        self.on_read: Callable[[], None] | None = None

    def mirror(self, members: list[tuple[int, float, EndpointInfo, list[str], list[str]]]) -> None:
        """The control process's membership: (its slot, token, info, running adapters, waiting adapters)."""
        self.replace_all(info for _, _, info, _, _ in members)
        old_tokens = self._tokens.copy()
        self._tokens[:] = -1.0
        self._local[:] = -1
        self._control = np.full(len(self.column("present")), -1, dtype=np.int64)
        for slot, token, info, running, waiting in members:
            local = self.slot_of(info.address)
            if local is None:
                continue
            self._tokens[slot] = token
            self._local[slot] = local
            self._control[local] = slot
            self.set_adapters(local, running, waiting)
        self._applied[self._tokens != old_tokens] = 0.0  # another endpoint in that row: take its rows afresh
        self._high = max((m[0] for m in members), default=-1) + 1
        self._control_of = self._control.tolist()
        self._bind_cells()
        self._named = list(zip(self._tokens.tolist(), self._local.tolist(), strict=True))
        self.names = [(control, int(self._named[control][0])) if control >= 0 else None for control in self._control_of]
        self.by_name = {  # int tokens (a record's are): no int-float compare per lookup; a float token never matches
            (control, int(token)): local
            for control, (token, local) in enumerate(self._named)
            if local >= 0 and token.is_integer()
        }
        self._versions = []  # other tokens: every row read afresh
        ours = np.flatnonzero(self._control >= 0)
        self._pairs = (ours, self._control[ours])
        small = ours.size * self._matrix.shape[0] * MATRIX_COLUMNS <= SMALL_CELLS
        pairs = zip(ours.tolist(), self._pairs[1].tolist(), strict=True)
        self._small = [(o, c * MATRIX_COLUMNS) for o, c in pairs] if small else None
        if self._stamp_array is not None:
            self.follow_stamps(self._stamp_array, *self._pairs)
        gone = np.flatnonzero((old_tokens >= 0) & (self._tokens != old_tokens))
        self._matrix[self._me, gone] = 0  # our picks on an endpoint that left are nobody's load

    def view(self) -> Snapshot:
        if self.on_read is not None:
            self.on_read()
        return _table_view(self)

    def refresh(self) -> int:
        """Take the rows scraped since the last call and everyone's in-flight sums; returns the rows taken."""
        n = self._high
        taken = 0
        versions = self._row_words[VERSION : n * NCOL : NCOL].tolist()  # before the rows are read (the seqlock's order)
        if n and versions != self._versions:
            self._versions = versions
            slots, rows = read_rows(self._rows[:n], self._tokens[:n], self._applied[:n])
            if slots.size:
                local = self._local[slots]
                keep = local >= 0
                slots, rows, local = slots[keep], rows[keep], local[keep]
                seen = np.nan_to_num(self.column("scraped_at")[local], nan=-np.inf)
                fresh = rows[:, SCRAPED_AT] > seen
                self.write_scrape_rows(local, rows[:, VALUES], rows[:, OK] > 0, rows[:, FAILURES].astype(np.int64))
                self._applied[slots] = rows[:, VERSION]
                self._matrix[self._me, slots[fresh], PICKS] = 0  # a fresh page shows our picks: stop adding them
                taken = int(slots.size)
        small = self._small
        if small is not None:
            native = self._native
            if native is None:
                self._sum_cells(small)
            else:  # `_sum_cells`, one call: ~0.6k instructions where the Python loop takes ~15k for 2 × 2
                counts = self._counts
                native.sum_cells(
                    self._cells,
                    self._end,
                    self._stride,
                    small,
                    counts["inflight"],
                    counts["picks_since_scrape"],
                    counts["inflight_tokens"],
                )
        else:
            ours, theirs = self._pairs
            if ours.size:
                self.set_bookings(ours, self._matrix[:, theirs, :].sum(axis=0))
        return taken

    def _sum_cells(self, pairs: list[tuple[int, int]]) -> None:
        """`set_bookings(ours, matrix[:, theirs].sum(axis=0))` on Python ints, for a small pool: each sum read from
        the matrix's cells, and written only where it differs from the table's."""
        cells, stride, end = self._cells, self._stride, self._end
        cols = self._cols
        inflight, picks, tokens = cols["inflight"], cols["picks_since_scrape"], cols["inflight_tokens"]
        for ours, first in pairs:
            n_flight = n_picks = n_tokens = 0
            for at in range(first, first + end, stride):
                n_flight += cells[at]  # INFLIGHT, PICKS, TOKENS: the record's three cells in order
                n_picks += cells[at + 1]
                n_tokens += cells[at + 2]
            if inflight.item(ours) != n_flight:
                inflight[ours] = n_flight
            if picks.item(ours) != n_picks:
                picks[ours] = n_picks
            if tokens.item(ours) != n_tokens:
                tokens[ours] = n_tokens

    def stamped(self, sources: np.ndarray) -> None:
        self._matrix[self._me, sources, PICKS] = 0  # a repeated page is a fresh one too: it shows our picks

    def _bind_cells(self) -> None:
        """Our row's booking and release as one call each, bound to this membership's slot map (the compiled twins
        of `book_cells_python` and `release_cells_python` when built: ~6k instructions a booking and its release
        in Python, where a pick's booking is in every worker's path)."""
        native = self._native
        book = native.book_cells if native is not None else book_cells_python
        release = native.release_cells if native is not None else release_cells_python
        self._book_cells = functools.partial(book, self._cells, self._base, self._control_of)
        self._release_cells = functools.partial(release, self._cells, self._base, self._control_of)

    def book_pick(self, slot: int, tokens: int = 0, prefill: int = 0) -> None:
        _table_book(self, slot, tokens, prefill)  # prefill is this process's own: not in the shared matrix
        self._book_cells(slot, tokens)

    def local_of(self, control: int, token: int) -> int | None:
        """Our slot of the control process's `control` slot, if it still holds the endpoint that had `token`."""
        return self.by_name.get((control, token))

    def release_pick(self, slot: int, tokens: int = 0, prefill: int = 0) -> None:
        _table_release(self, slot, tokens, prefill)
        self._release_cells(slot, tokens)


def book_cells_python(cells: memoryview, base: int, control_of: list[int], slot: int, tokens: int) -> None:
    """A pick booked in our row of the in-flight matrix: our slot's control slot (none: nothing) names its record,
    a pick more in flight, a pick more since the scrape, its tokens. The definition of the compiled `book_cells`
    (epp/app/_pick_log.c; tests/app/test_workers_shared_state.py holds the two equal)."""
    control = control_of[slot] if 0 <= slot < len(control_of) else -1
    if control >= 0:
        at = base + control * MATRIX_COLUMNS
        cells[at + INFLIGHT] += 1
        cells[at + PICKS] += 1
        if tokens:
            cells[at + TOKENS] += tokens


def release_cells_python(cells: memoryview, base: int, control_of: list[int], slot: int, tokens: int) -> None:
    """`book_cells_python`'s booking ends: a pick less in flight and its tokens, neither below 0."""
    control = control_of[slot] if 0 <= slot < len(control_of) else -1
    if control >= 0:
        at = base + control * MATRIX_COLUMNS
        cells[at + INFLIGHT] = max(0, cells[at + INFLIGHT] - 1)
        if tokens:
            cells[at + TOKENS] = max(0, cells[at + TOKENS] - tokens)
