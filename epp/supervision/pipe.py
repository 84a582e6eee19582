"""The pipe between a child and its parent, watched from the event loop, and file descriptors passed over it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


def watch_pipe(loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[..., Any], *args: Any) -> None:
    """Call `callback(*args)` on the loop whenever `conn` (the pipe between a child and its parent) is readable.

    uvloop (libuv's poll handle) switches a watched descriptor to non-blocking mode. A Connection's messages are
    length-prefixed and may be larger than a socket buffer (a worker's metrics exposition): on a non-blocking
    descriptor `recv` fails half-way through a message (EAGAIN) and `send` stops half-way through one, which
    leaves the stream unreadable for good (seen as a worker whose metrics froze). So the descriptor goes back to
    blocking mode: the loop learns that a message has begun, and reading it to its end waits for the writer, who
    is writing it."""
    loop.add_reader(conn.fileno(), callback, *args)
    os.set_blocking(conn.fileno(), True)


def send_fd(conn: Connection, fd: int) -> None:
    """Pass a descriptor (a memfd) to the other end: one byte with the descriptor attached (SCM_RIGHTS). The
    sender writes it right after the message that announces it, under the same lock, so the reader, having read
    that message whole, reads this byte next."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        socket.send_fds(sock, [b"F"], [fd])


def recv_fd(conn: Connection) -> int:
    """The descriptor `send_fd` passed: the receiver's own copy, to close when done."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if not fds:
        raise OSError("a descriptor was announced but none came")
    return fds[0]
