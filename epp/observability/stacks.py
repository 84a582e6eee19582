"""`/debug/stacks`: every thread's stack and every asyncio task's, as text, for a picker that looks stuck.

The Python counterpart of Go's goroutine dump (`/debug/pprof/goroutine?debug=2`): a hung stream, a watch that
stopped, a loop blocked in a call show up as the frame they wait in. Served only with `--enable-pprof` (it shows
the code's internals). Tasks are grouped by coroutine with a count first, since a busy picker holds one task per
open stream; the full stacks of at most `MAX_TASK_STACKS` tasks follow.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
import traceback
from collections import Counter

MAX_TASK_STACKS = 500


def _coro_name(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or type(coro).__name__


def dump_stacks(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """All threads, then all tasks of `loop` (the running loop when called on it)."""
    out = io.StringIO()
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    out.write(f"# threads: {len(frames)}\n\n")
    for ident, frame in sorted(frames.items(), key=lambda item: names.get(item[0], "")):
        out.write(f"thread {names.get(ident, '?')} (id {ident}):\n")
        out.write("".join(traceback.format_stack(frame)))
        out.write("\n")
    try:
        tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    except RuntimeError:  # no running loop in this thread
        tasks = []
    by_coro = Counter(_coro_name(t) for t in tasks)
    out.write(f"# asyncio tasks: {len(tasks)}\n")
    for name, count in by_coro.most_common():
        out.write(f"{count:6d}  {name}\n")
    out.write("\n")
    for task in tasks[:MAX_TASK_STACKS]:
        out.write(f"task {task.get_name()} ({_coro_name(task)}):\n")
        buf = io.StringIO()
        task.print_stack(file=buf)
        out.write(buf.getvalue())
        out.write("\n")
    if len(tasks) > MAX_TASK_STACKS:
        out.write(f"# {len(tasks) - MAX_TASK_STACKS} more tasks not shown\n")
    return out.getvalue()


_last_heap: list[object] = []  # the previous `/debug/heap` snapshot, to show growth between two calls


def dump_heap(top: int = 25) -> str:
    """Allocation sites by size, and their growth since the previous call, when tracemalloc traces.

    Tracing costs memory and time, so it is off unless the process starts with `PYTHONTRACEMALLOC=N` (N frames).
    """
    import tracemalloc

    if not tracemalloc.is_tracing():
        return "tracemalloc is off: start the picker with PYTHONTRACEMALLOC=1 (or more frames) to use /debug/heap\n"
    snapshot = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
    out = io.StringIO()
    current, peak = tracemalloc.get_traced_memory()
    out.write(f"# traced: {current / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB peak\n")
    if _last_heap:
        out.write(f"\n# growth since the previous call (top {top})\n")
        previous = _last_heap[0]
        assert isinstance(previous, tracemalloc.Snapshot)
        for diff in snapshot.compare_to(previous, "lineno")[:top]:
            out.write(f"{diff.size_diff / 1024:+10.1f} KiB {diff.count_diff:+8d}  {diff.traceback}\n")
    out.write(f"\n# largest sites (top {top})\n")
    for stat in snapshot.statistics("lineno")[:top]:
        out.write(f"{stat.size / 1024:10.1f} KiB {stat.count:8d}  {stat.traceback}\n")
    _last_heap[:] = [snapshot]
    return out.getvalue()
