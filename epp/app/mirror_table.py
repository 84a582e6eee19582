"""The control process's endpoint table as one serving worker sees it (epp.app.worker).

The rows come from the shared-row block the control process writes (epp.datastore.rows, by its slot, seqlocked);
the in-flight matrix has one row per worker and one column per control slot, each worker writing only its own row
as it books and releases picks, every worker reading the sum; the stamps date rows whose page repeated itself
without rewriting them. A worker's slots are its own (its table is rebuilt from the membership the control process
sends), so the mirror keeps both maps: control slot to ours, ours to control.
"""

from __future__ import annotations

import numpy as np

from epp.datastore.rows import FAILURES, OK, SCRAPED_AT, VALUES, VERSION, read_rows
from epp.datastore.table import EndpointInfo, EndpointTable

INFLIGHT, PICKS, TOKENS = 0, 1, 2  # the in-flight matrix's columns: picks in flight, picks since scrape, tokens
MATRIX_COLUMNS = 3


class MirrorTable(EndpointTable):
    """The control process's endpoint table as one worker sees it, with every worker's picks in flight summed."""

    def __init__(self, rows: np.ndarray, inflight: np.ndarray, me: int, stamps: np.ndarray | None = None) -> None:
        super().__init__()
        self._rows = rows
        self._stamp_array = stamps  # by control slot (epp.datastore.rows): dates rows whose page repeated itself
        self._matrix = inflight
        self._me = me
        n = rows.shape[0]
        self._tokens = np.full(n, -1.0)
        self._applied = np.zeros(n)
        self._local = np.full(n, -1, dtype=np.int64)  # control slot → our slot
        self._control = np.zeros(0, dtype=np.int64)  # our slot → control slot (-1: none)
        self._high = 0
        self._pairs = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))  # (our slots, control slots)
        inflight[me] = 0

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
        ours = np.flatnonzero(self._control >= 0)
        self._pairs = (ours, self._control[ours])
        if self._stamp_array is not None:
            self.follow_stamps(self._stamp_array, *self._pairs)
        gone = np.flatnonzero((old_tokens >= 0) & (self._tokens != old_tokens))
        self._matrix[self._me, gone] = 0  # our picks on an endpoint that left are nobody's load

    def refresh(self) -> int:
        """Take the rows scraped since the last call and everyone's in-flight sums; returns the rows taken."""
        n = self._high
        taken = 0
        if n:
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
        ours, theirs = self._pairs
        if ours.size:
            self.set_bookings(ours, self._matrix[:, theirs, :].sum(axis=0))
        return taken

    def stamped(self, sources: np.ndarray) -> None:
        self._matrix[self._me, sources, PICKS] = 0  # a repeated page is a fresh one too: it shows our picks

    def book_pick(self, slot: int, tokens: int = 0) -> None:
        super().book_pick(slot, tokens)
        control = self._control[slot] if slot < len(self._control) else -1
        if control >= 0:
            row = self._matrix[self._me, control]
            row[INFLIGHT] += 1
            row[PICKS] += 1
            row[TOKENS] += tokens

    def control_of(self, slot: int) -> tuple[int, int] | None:
        """(the control process's slot, its token) of our `slot`: how a shared record names the endpoint."""
        control = int(self._control[slot]) if slot < len(self._control) else -1
        return (control, int(self._tokens[control])) if control >= 0 else None

    def local_of(self, control: int, token: int) -> int | None:
        """Our slot of the control process's `control` slot, if it still holds the endpoint that had `token`."""
        if not 0 <= control < len(self._local) or self._tokens[control] != token:
            return None
        local = int(self._local[control])
        return local if local >= 0 else None

    def release_pick(self, slot: int, tokens: int = 0) -> None:
        super().release_pick(slot, tokens)
        control = self._control[slot] if slot < len(self._control) else -1
        if control >= 0:
            row = self._matrix[self._me, control]
            row[INFLIGHT] = max(0, int(row[INFLIGHT]) - 1)
            row[TOKENS] = max(0, int(row[TOKENS]) - tokens)
