"""The shared-row layout: one endpoint's scraped signals as a row of float64, seqlocked, in memory another process
maps.

Two blocks use it, each with one writer: the scrape child writes the rows the control process reads
(`epp.scrape.process`), and the control process writes the rows its serving workers read (`epp.app.workers`,
`epp.app.worker`). Both are indexed by the *reader's* slot and carry a token per row: a slot reused by another
endpoint gets a new token, so the late rows of the old one are ignored.

A row is `[token, <SCRAPE_ROW columns>, ok, failures, version]`; this module is its only definition (the lowest
layer every writer and reader may import).

The seqlock: `version` is odd while the writer writes the row, even once it is whole. A reader copies the block,
and keeps the rows whose version was even and unchanged across its copy.

Beside a block, its writer may keep *stamps* (the scrape child does, for the control process and the workers): one
float64 per reader slot, the time of the latest scrape whose page repeated the values the row already carries, and
a last element counting the passes that wrote any. A repeated page then costs its reader nothing until it reads
the table (`EndpointTable.follow_stamps`): no row to copy, no message to wake it. A stamp is one aligned 8-byte
store, whole or not yet there; the counter is stored after the stamps, so a reader that sees it move sees them.

Memory order (what this relies on): the writer's stores become visible to the reader in program order (the odd
version before the values, the values before the even version), and the reader's loads are not reordered with
each other. numpy issues plain stores and loads, with no fence: that holds on x86-64 (total store order), not on
aarch64 or POWER, where a reader could see the new even version with old values. The picker builds and is
measured on x86-64; a port to a weakly ordered CPU needs release stores on the version here (and acquire loads in
`read_rows`), as does the KV-event table (epp.kvevents.shared, masks before keys).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The table's columns a row carries, in this order (`EndpointTable.write_scrape_rows` takes them so).
SCRAPE_ROW = ("waiting", "running", "kv_usage", "max_lora", "block_size", "num_blocks", "scraped_at")

TOKEN = 0
VALUES = slice(1, 1 + len(SCRAPE_ROW))
OK = VALUES.stop
FAILURES = OK + 1
VERSION = FAILURES + 1
NCOL = VERSION + 1
SCRAPED_AT = VALUES.start + SCRAPE_ROW.index("scraped_at")  # a row's `scraped_at` column
SCRAPED_AT_VALUE = SCRAPE_ROW.index("scraped_at")  # its position among the values


def scrape_values(snapshot: object, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """The SCRAPE_ROW columns of a table snapshot at `rows`, one row each: what `write_rows` takes as `values`."""
    return np.stack([getattr(snapshot, name)[rows] for name in SCRAPE_ROW], axis=1)


def read_rows(
    live: npt.NDArray[np.float64], tokens: npt.NDArray[np.float64], applied: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(row indices, copies of those rows) of a seqlocked block that are complete, newer than `applied` (their
    last applied versions) and still about the endpoint whose token the reader holds for that row."""
    before = live[:, VERSION].copy()  # loaded before the copy's values (x86-64 keeps loads in order: see above)
    data = live.copy()
    ok = (before == live[:, VERSION]) & (before % 2 == 0) & (data[:, TOKEN] == tokens)
    ok &= data[:, VERSION] > applied
    slots = np.flatnonzero(ok)
    return slots, data[slots]


def write_stamps(stamps: npt.NDArray[np.float64], rows: npt.NDArray[np.int64], at: npt.NDArray[np.float64]) -> None:
    """Stamp `rows` as scraped at `at` with their values unchanged, then count the pass (the reader's cue)."""
    stamps[rows] = at
    stamps[-1] += 1.0


def write_rows(
    block: npt.NDArray[np.float64],
    rows: npt.NDArray[np.int64],
    tokens: npt.NDArray[np.float64],
    values: npt.NDArray[np.float64],
    ok: npt.ArrayLike,
    failures: npt.ArrayLike,
) -> None:
    """The writer's half of the seqlock: `version` odd while the rows are written, even once they are whole. The
    stores must land in this order for a reader (true on x86-64, where they are issued in order: see above)."""
    block[rows, VERSION] += 1  # odd: being written
    block[rows, TOKEN] = tokens
    block[rows, VALUES] = values
    block[rows, OK] = ok
    block[rows, FAILURES] = failures
    block[rows, VERSION] += 1  # even: complete
