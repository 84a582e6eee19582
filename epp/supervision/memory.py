"""Shared memory between a parent and its children: memfd only.

One scheme for every block the picker shares (the scrape child's rows; the workers' rows, in-flight matrix, stats
and pick log; the KV-event table and its directory): an anonymous memory file (`memfd_create`) whose descriptor
the child inherits at spawn (`pass_fds`) or that travels over the pipe (`epp.supervision.pipe.send_fd`: the
KV-event table's generations, made by the child). It has no name: nothing is left in /dev/shm by a process that
dies however it dies (SIGKILL included), no resource tracker is involved, and the memory is freed when the last
descriptor and mapping go.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np


def new_memfd(name: str, nbytes: int) -> int:
    """A zero-filled memory file of `nbytes` (at least one page); its descriptor (close-on-exec: a child gets it
    only through `pass_fds`). Raises OSError where memfd is not available."""
    fd = os.memfd_create(f"epp-{name}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(1, nbytes))
    except OSError:
        os.close(fd)
        raise
    return fd


def map_array(fd: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An array over the memory file `fd` (shared with whoever else maps it); the mapping outlives the descriptor."""
    size = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return np.ndarray(shape, dtype=dtype, buffer=mmap.mmap(fd, size))
