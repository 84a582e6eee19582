"""A child for the kit's own tests (tests/supervision/test_child.py): what it does is its `Start` payload."""

from __future__ import annotations

import os
import threading
import time

from epp.supervision.child_end import ChildEnd
from epp.supervision.memory import new_memfd
from epp.supervision.messages import Stop


def child_main(end: ChildEnd) -> int:
    mode = str(end.payload)
    if mode == "never-ready":
        time.sleep(600)
        return 0
    if mode == "exit-3":
        end.ready()
        return 3
    if mode == "send-fd":  # a memory file made here, written, passed to the parent
        fd = new_memfd("sample", 4096)
        os.pwrite(fd, b"from the child", 0)
        end.ready()
        end.send_with_fd("here", fd)
    gone = threading.Event()
    end.on_parent_gone(gone.set)
    if mode == "ready":
        end.ready()

    def read() -> None:
        try:
            while not isinstance(end.conn.recv(), Stop):
                pass
        except (EOFError, OSError):
            pass
        gone.set()

    threading.Thread(target=read, daemon=True).start()
    while not gone.wait(0.1):
        end.beat()
    return 0
