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
