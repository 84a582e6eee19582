"""Child processes for the demo, tests and benchmarks: started with their output in a log file, waited for until
ready, and always stopped by PID (SIGTERM, then SIGKILL), even when the caller fails."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out; racy in theory, fine on loopback in practice."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {proc.returncode}")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not ready after {timeout_s}s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def running(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process whose output goes to `log_path`; stopped by PID when the block ends."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=cwd
        )
        try:
            yield proc
        finally:
            stop(proc)


def epp_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "epp", *args]


def serve_argv(grpc_port: int, health_port: int, metrics_port: int, *flags: str) -> list[str]:
    """`epp serve` on loopback with these three ports, plus `flags`: how the demo, tests and benchmarks start it.

    No drain after SIGTERM (upstream's 30 s applies in cluster mode): nothing here routes by DNS, so a stop is at once.
    """
    ports = ("--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port))
    return epp_argv("serve", "--bind-address", "127.0.0.1", *ports, "--drain-timeout=0s", *flags)
