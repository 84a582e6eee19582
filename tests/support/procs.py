"""Process helpers for tests: the same ones the demo uses, run from the repository root."""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from epp.demo.processes import epp_argv, free_port, http_ok, port_open, serve_argv, stop, wait_until
from epp.demo.processes import running as _running

ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "ROOT",
    "echo_backends",
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


@contextlib.contextmanager
def echo_backends(count: int, log_path: Path) -> Iterator[list[str]]:
    """`count` OpenAI-shaped echo backends (tests/support/echo_backend.py) in one process on free loopback ports,
    yielded as their addresses once every port accepts connections."""
    ports = [free_port() for _ in range(count)]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    with running([sys.executable, "-m", "tests.support.echo_backend", ",".join(addresses)], log_path) as proc:
        for p in ports:
            wait_until(functools.partial(port_open, p), 15, f"backend {p}", proc)
        yield addresses
