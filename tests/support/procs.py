"""Process helpers for tests: the same ones the demo uses, run from the repository root."""

from __future__ import annotations

import contextlib
import re
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from epp.demo.processes import epp_argv, free_port, http_ok, port_open, serve_argv, stop, wait_until
from epp.demo.processes import running as _running

ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "ROOT",
    "epp_argv",
    "free_port",
    "http_ok",
    "http_text",
    "metric_value",
    "port_open",
    "running",
    "serve_argv",
    "stop",
    "wait_until",
]


def http_text(url: str, timeout: float = 5.0) -> str:
    """The body of a GET (a /metrics page, /debug/pool) as text."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def metric_value(text: str, name: str) -> float:
    """The value of the unlabelled series `name` in an exposition, 0 when it is absent (not yet counted)."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@contextlib.contextmanager
def running(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with _running(argv, log_path, env, cwd=ROOT) as proc:
        yield proc
