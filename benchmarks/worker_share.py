"""What a serving worker does per request that one process does not: its pick into the shared log, and the other
worker's refresh that reads it and learns it (`--workers 2`, epp.app.worker), counted in CPU instructions.

Two workers over one table of 2 endpoints, the default profile's prefix scorer each: per request worker A appends
its pick (its scorer's `on_pick`, `epp.app.worker._sharing`: the endpoint named as the shared log names it, then
`PickLog.append`) and every `--batch` requests worker B refreshes (its table from the shared rows and in-flight
matrix, then `_learn`: the records read and learned), as a busy worker's decisions do at most every 10 ms.
Prompts of 11 blocks (the 752-byte chat body of benchmarks/routers.py):
`repeat`, one prompt for every request (what benchmarks/routers.py sends), or `distinct`, a new prompt each; their
hashes are made before the count starts (the picking worker's scorer made them for its own pick, as one process's
does), so the count is the record's cost, not the driver's arithmetic. `own`: the picking worker's own calls per
request beside the record, its table's `view` (with an `on_read` that finds the table fresh, as between two
refreshes) and a pick's booking and release (`MirrorTable.book_pick`, `release_pick`: its row of the in-flight
matrix too), and `own-one-process` the same three calls on one process's `EndpointTable`: the difference is what
only a worker pays there.

    .venv/bin/python -m benchmarks.worker_share [--requests 2000] [--batch 5] [--root CHECKOUT ...]

Instructions per request by valgrind's callgrind inside the measured loop only (as benchmarks/stream_path.py
counts them: the loop runs inside one `functools.reduce` call, the C function collection is toggled on), with each
`--root` (another checkout, e.g. a `git worktree` of an older commit with its C extensions built) measured by the
same driver. Needs `valgrind` (Debian package). Benchmarks are not run by CI.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

BLOCKS = 11
WORKLOADS = ("repeat", "distinct", "own", "own-one-process")
WARM = 300


def build(workload: str, batch: int, requests: int) -> Callable[[], None]:
    import numpy as np

    if workload.startswith("own"):
        return _own(workload == "own")

    from epp.app.mirror_table import MATRIX_COLUMNS, MirrorTable
    from epp.app.pick_log import PickLog, ring_words
    from epp.app.worker import _learn, _sharing
    from epp.datastore.rows import NCOL, TOKEN
    from epp.datastore.table import EndpointInfo
    from epp.scheduling import build_scheduler

    workers, endpoints = 2, 2
    rows = np.zeros((16, NCOL))
    rows[:, TOKEN] = -1.0
    matrix = np.zeros((workers, 16, MATRIX_COLUMNS), dtype=np.int64)
    shared = np.zeros(ring_words(workers), dtype=np.int64)
    stats = np.zeros((workers, 4), dtype=np.int64)
    members: list[tuple[int, float, EndpointInfo, list[str], list[str]]] = [
        (slot, float(10 + slot), EndpointInfo(f"127.10.0.{slot + 1}:8000"), [], []) for slot in range(endpoints)
    ]
    tables = [MirrorTable(rows, matrix, me) for me in range(workers)]
    for table in tables:
        table.mirror(members)
        table.synced = True
    writer, reader = PickLog(shared, workers, 0), PickLog(shared, workers, 1)
    scorers = list(build_scheduler(None, seed=1).prefix_scorers)
    counter = [0]
    # The prompts' block hashes, made before the count starts: the picking worker's scorer hashed them for its own
    # pick (one process does that too), so what is counted is what the record costs, not this driver's arithmetic.
    chains = range(requests + 1) if workload == "distinct" else [0] * (requests + 1)
    prompts = [[(chain << 8 | depth) * 0x9E3779B97F4A7C15 % 2**64 for depth in range(BLOCKS)] for chain in chains]

    share = _sharing(writer, tables[0], 0)  # the picking worker's prefix scorer's `on_pick`, as the worker wires it
    ours = []  # worker A's slot of each control slot
    for control in range(endpoints):
        local = tables[0].local_of(control, 10 + control)
        assert local is not None
        ours.append(local)

    def one() -> None:
        n = counter[0] = counter[0] + 1
        share(ours[n % endpoints], prompts[n])
        if n % batch == 0:
            tables[1].refresh()
            _learn(reader, tables[1], scorers, stats[1])

    return one


def _own(worker: bool) -> Callable[[], None]:
    """A decision's table read, booking and release, on a worker's table (`worker`) or one process's."""
    import numpy as np

    from epp.app.mirror_table import MATRIX_COLUMNS, MirrorTable
    from epp.datastore.rows import NCOL, TOKEN
    from epp.datastore.table import EndpointInfo, EndpointTable

    endpoints = 2
    infos = [EndpointInfo(f"127.10.0.{slot + 1}:8000") for slot in range(endpoints)]
    table: EndpointTable
    if worker:
        rows = np.zeros((16, NCOL))
        rows[:, TOKEN] = -1.0
        table = MirrorTable(rows, np.zeros((2, 16, MATRIX_COLUMNS), dtype=np.int64), 0)
        table.mirror([(slot, float(10 + slot), info, [], []) for slot, info in enumerate(infos)])
        refreshed_at, clock = [0.0], [0.0]

        def on_read() -> None:  # the worker's (epp.app.worker): the table is fresh, nothing to take
            if clock[0] - refreshed_at[0] >= 0.01:
                refreshed_at[0] = clock[0]

        table.on_read = on_read
    else:
        table = EndpointTable()
        table.replace_all(infos)
    table.synced = True
    slots = [table.slot_of(info.address) or 0 for info in infos]
    counter = [0]

    def one() -> None:
        n = counter[0] = counter[0] + 1
        slot = slots[n % endpoints]
        table.view()
        table.book_pick(slot, 100)
        table.release_pick(slot, 100)

    return one


def _child(workload: str, requests: int, batch: int) -> None:
    one = build(workload, batch, WARM + requests)
    for _ in range(WARM):  # warm: the index holds what it will hold
        one()

    def step(_: None, __: int) -> None:
        one()

    functools.reduce(step, range(requests), None)  # the one C call callgrind collects inside


def _instructions(root: Path, workload: str, requests: int, batch: int) -> float:
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=functools_reduce",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        workload,
        str(requests),
        str(batch),
    ]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "0"}
    out = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or found is None:
        raise RuntimeError(f"callgrind failed in {root}:\n{out.stderr[-2000:]}")
    return int(found.group(1)) / requests


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=5, help="requests per refresh of the reading worker")
    parser.add_argument("--root", action="append", default=[], help="another checkout to measure the same way")
    args = parser.parse_args()
    roots = [Path(__file__).resolve().parent.parent, *(Path(r).resolve() for r in args.root)]
    print("| checkout | " + " | ".join(f"{w}: instructions per request" for w in WORKLOADS) + " |")
    print("|---|" + "---|" * len(WORKLOADS))
    for root in roots:
        counts = [_instructions(root, w, args.requests, args.batch) for w in WORKLOADS]
        print(f"| {root} | " + " | ".join(f"{c:,.0f}" for c in counts) + " |", flush=True)
        print(json.dumps({"root": str(root), **dict(zip(WORKLOADS, counts, strict=True))}), file=sys.stderr)


if __name__ == "__main__":
    main()
