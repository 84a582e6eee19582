"""Process helpers for tests: the same ones the demo uses, run from the repository root."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from epp.demo.processes import epp_argv, free_port, http_ok, port_open, serve_argv, stop, wait_until
from epp.demo.processes import running as _running

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "epp_argv", "free_port", "http_ok", "port_open", "running", "serve_argv", "stop", "wait_until"]


@contextlib.contextmanager
def running(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with _running(argv, log_path, env, cwd=ROOT) as proc:
        yield proc
