"""The picker's children (serving workers, the scrape child, the KV-events feeder) follow their control process.

Reproductions kept: SIGTERM to the process group (Ctrl-C in a terminal, systemd's default KillMode) made the
control process log `worker 0 died (exit code 0) … restarting in 0.2s` and `scrape process … died (killed by
SIGTERM) … restarting` and start new children while it drained; and a control process killed with SIGKILL left
its children running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.test_serve_workers import alive
from tests.support.procs import ROOT, free_port, http_ok, serve_argv, wait_until

pytestmark = pytest.mark.process

PRECISE = Path(__file__).parents[1] / "data/epp-configs/llmd-router-precise-prefix-cache-config.yaml"


@contextlib.contextmanager
def group_leader(argv: list[str], log_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """`epp serve` as the leader of a process group of its own, as a terminal's job or a systemd unit is, and the
    list the test puts its children's PIDs in: every one is stopped by its PID when the block ends."""
    pids: list[int] = []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            yield proc, pids
        finally:
            for pid in (proc.pid, *pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(10)


def debug_pool(metrics_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as r:
        report: dict[str, Any] = json.loads(r.read())
    return report


def children_of(report: dict[str, Any]) -> list[int]:
    """Every child process the report names: the workers, the scrape child, the KV-events feeder."""
    pids = [w["pid"] for w in report.get("workers", [])]
    pids += [report.get("scrapeProcess", {}).get("pid"), report.get("kvEvents", {}).get("pid")]
    return [int(pid) for pid in pids if pid is not None]


def start_picker(proc: subprocess.Popen[bytes], metrics_port: int, expected: int, pids: list[int]) -> list[int]:
    """Wait until the picker is ready with `expected` children up (workers serving); their PIDs, also into `pids`."""
    wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), 60, "serve", proc)

    def all_up() -> bool:
        report = debug_pool(metrics_port)
        return len(children_of(report)) == expected and all(w["serving"] for w in report.get("workers", []))

    wait_until(all_up, 60, "every child", proc)
    pids.extend(children_of(debug_pool(metrics_port)))
    return list(pids)


def test_sigterm_to_the_process_group_stops_every_child_once_and_exits_0(tmp_path: Path) -> None:
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = serve_argv(
        grpc_port, health_port, metrics_port, "--static-endpoints", "127.10.0.1:8000", "--workers", "2",
        "--grace-period", "10s",
    )  # fmt: skip
    log = tmp_path / "serve.log"
    with group_leader(argv, log) as (proc, started):
        pids = start_picker(proc, metrics_port, 3, started)  # two workers and the scrape child
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the group, as Ctrl-C or systemd would
        assert proc.wait(timeout=20) == 0  # within the grace period (+ the children's stop)
    text = log.read_text()
    assert "restarting" not in text and "restarted" not in text and "died" not in text, text
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--workers", "2"), 3),  # two workers and the scrape child
        (("--workers", "1", "--config-file", str(PRECISE)), 2),  # the scrape child and the KV-events feeder
    ],
    ids=["workers-and-scrape-child", "kv-events-feeder-and-scrape-child"],
)
def test_no_child_outlives_a_control_process_killed_with_sigkill(
    tmp_path: Path, flags: tuple[str, ...], expected: int
) -> None:
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = serve_argv(grpc_port, health_port, metrics_port, "--static-endpoints", "127.10.0.1:8000", *flags)
    with group_leader(argv, tmp_path / "serve.log") as (proc, started):
        pids = start_picker(proc, metrics_port, expected, started)
        proc.kill()  # SIGKILL: no handler runs, nothing is told
        proc.wait(10)
        time.sleep(2.0)
        assert not [pid for pid in pids if alive(pid)], (tmp_path / "serve.log").read_text()
