"""The child-process kit's rules, on a sample child (tests/supervision/sample_child.py): the start timeout, no
restart once shutdown began, the process group's SIGTERM ignored while the parent lives, a descriptor passed back
on the pipe, the report /debug/pool shows."""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from epp.supervision.child import Child, Policy
from epp.supervision.pipe import recv_fd

pytestmark = pytest.mark.process

REPORT_KEYS = {"pid", "up", "ready", "restarts", "last_exit", "running_for_s", "next_restart_in_s"}


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def sample(mode: str, **kwargs: Any) -> Child:
    return Child("tests.supervision.sample_child", "sample {pid}", payload=lambda: mode, **kwargs)


async def test_a_child_that_never_says_ready_is_killed_after_the_start_timeout_and_restarted() -> None:
    child = sample("never-ready", policy=Policy(start_timeout_s=1.0, restart_initial_s=0.05))
    child.start()
    try:
        first = child.pid
        await until(lambda: child.pid not in (None, first))
        assert child.last_exit == "killed by SIGKILL" and child.restarts == 1
    finally:
        await child.stop(1.0)


async def test_after_begin_shutdown_a_child_that_ends_is_not_restarted(caplog: pytest.LogCaptureFixture) -> None:
    child = sample("ready", policy=Policy(restart_initial_s=0.05))
    child.start()
    with caplog.at_level(logging.INFO):
        try:
            await until(lambda: child.ready)
            pid = child.pid
            assert pid is not None
            child.begin_shutdown()
            os.kill(pid, signal.SIGKILL)
            await until(lambda: child.proc is None)
            await asyncio.sleep(0.3)  # several restart delays
            assert child.proc is None and child.restarts == 0 and child.restart_at is None
        finally:
            await child.stop(1.0)
    assert not [r for r in caplog.records if "restarting" in r.getMessage()]
    assert [r for r in caplog.records if f"sample {pid} exited (killed by SIGKILL)" in r.getMessage()]


async def test_a_child_ignores_sigterm_while_its_parent_lives_and_stops_when_told() -> None:
    child = sample("ready")
    child.start()
    try:
        await until(lambda: child.ready)
        pid = child.pid
        assert pid is not None and child.proc is not None
        os.kill(pid, signal.SIGTERM)  # what a SIGTERM to the whole process group gives it
        os.kill(pid, signal.SIGINT)  # Ctrl-C
        await asyncio.sleep(0.5)
        assert child.proc is not None and child.proc.poll() is None and child.restarts == 0
    finally:
        await child.stop(5.0)
    assert child.last_exit == "exit code 0"  # `Stop`: a clean exit, not a kill


async def test_a_child_that_exits_is_restarted_with_how_it_ended_in_the_report() -> None:
    child = sample("exit-3", policy=Policy(restart_initial_s=10.0))
    child.start()
    try:
        await until(lambda: child.last_exit is not None)
        report = child.report(time.monotonic())
        assert set(report) == REPORT_KEYS
        assert report["last_exit"] == "exit code 3" and report["pid"] is None and not report["up"]
        assert 0 < report["next_restart_in_s"] <= 12.0
    finally:
        await child.stop(1.0)


async def test_a_memory_file_made_by_the_child_reaches_the_parent_on_the_pipe() -> None:
    got: list[bytes] = []

    def on_message(msg: Any) -> None:
        assert msg == "here"
        assert child.conn is not None
        fd = recv_fd(child.conn)
        with mmap.mmap(fd, 4096) as memory:
            got.append(memory[:14])
        os.close(fd)

    child = sample("send-fd", on_message=on_message)
    child.start()
    try:
        await until(lambda: bool(got))
        assert got == [b"from the child"]
    finally:
        await child.stop(5.0)
