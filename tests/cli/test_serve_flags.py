"""Bad flags or files end with one line naming the problem and exit code 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.procs import epp_argv


@pytest.mark.process
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--grpc-port", "70000"], "port out of range"),
        (["serve", "--grpc-port", "abc"], "not a port number"),
        (["serve", "--max-body-bytes", "0"], "must be positive"),
        (["serve", "--no-such-flag"], "unrecognized arguments"),
        (["serve", "--static-endpoints", "nope"], "not an IP address"),
        (["serve"], "no endpoint source"),
        (["serve", "--static-endpoints", "127.0.0.1:1", "--pool-file", "/nonexistent/pool.yaml"], "cannot read"),
        (["serve", "--max-concurrent-streams", "0"], "must be positive"),
        (["serve", "--stream-idle-timeout", "0s"], "--stream-idle-timeout"),
        (["serve", "--static-endpoints", "127.0.0.1:1", "--max-buffered-body-bytes", "10"], "below --max-body-bytes"),
    ],
    ids=[
        "port-range",
        "port-text",
        "body-limit",
        "unknown-flag",
        "bad-endpoint",
        "no-source",
        "missing-pool-file",
        "stream-cap",
        "idle-timeout",
        "budget-below-body-limit",
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = subprocess.run(epp_argv(*args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
