"""A reader that closes the pipe early (`epp check-config FILE | head`) ends the command quietly."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

DATA = Path(__file__).resolve().parents[1] / "data" / "epp-configs"


def test_a_closed_stdout_pipe_exits_quietly_with_the_sigpipe_status() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "epp", "check-config", str(DATA / "gie-integration-default-config.yaml")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 128 + signal.SIGPIPE
    assert b"Traceback" not in done.stderr and b"BrokenPipeError" not in done.stderr, done.stderr.decode()
