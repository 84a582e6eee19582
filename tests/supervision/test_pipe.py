"""The pipe to a child, watched from the serving loop (uvloop, as `epp serve` runs): a message larger than a
socket buffer arrives whole, and one sent while the reader is busy is not cut in half.

Reproduction kept: under uvloop the watched descriptor turned non-blocking, a serving worker's ~40 KB metrics
exposition arrived in parts, the parent's `recv` failed with EAGAIN half-way and stopped reading that worker for
good; its /metrics froze at the first exposition (an e2e run failed one time in two).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from multiprocessing.connection import Connection

import uvloop

from epp.supervision.pipe import watch_pipe

BIG = b"x" * (4 * 1024 * 1024)  # far above a socket buffer: the writer blocks until the reader has read parts


def test_a_message_larger_than_the_socket_buffer_arrives_whole_on_a_watched_pipe() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = Connection(ours.detach()), Connection(theirs.detach())
    received: list[bytes] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_message() -> None:
            while reader.poll():
                received.append(reader.recv_bytes())
                if len(received) == 3:
                    done.set()

        watch_pipe(loop, reader, on_message)
        assert os.get_blocking(reader.fileno())
        sender = threading.Thread(target=lambda: [writer.send_bytes(m) for m in (b"small", BIG, b"after")])
        sender.start()
        await asyncio.wait_for(done.wait(), 30)
        loop.remove_reader(reader.fileno())
        sender.join()

    try:
        uvloop.run(main())
    finally:
        reader.close()
        writer.close()
    assert [len(m) for m in received] == [5, len(BIG), 5]


def test_the_child_can_send_on_the_pipe_it_watches_without_cutting_a_message() -> None:
    """The worker's own end is watched too (control messages come in on it) and carries its big expositions out:
    a send that the reader is slow to take blocks until it is whole, instead of stopping half-way."""
    ours, theirs = socket.socketpair()
    parent, child = Connection(ours.detach()), Connection(theirs.detach())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        watch_pipe(loop, child, lambda: None)
        assert os.get_blocking(child.fileno())
        got: list[bytes] = []
        taker = threading.Thread(target=lambda: got.extend(parent.recv_bytes() for _ in range(2)))
        taker.start()
        child.send_bytes(BIG)  # would raise BlockingIOError half-way on a non-blocking descriptor
        child.send_bytes(b"next")
        taker.join(30)
        loop.remove_reader(child.fileno())
        assert [len(m) for m in got] == [len(BIG), 4]

    try:
        uvloop.run(main())
    finally:
        parent.close()
        child.close()
