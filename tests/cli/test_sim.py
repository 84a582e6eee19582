"""`epp sim` as an operator runs it: a real process on loopback ports, stopped by its PID."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from epp.cli import main

pytestmark = pytest.mark.timeout(60)


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return int(port)
    raise RuntimeError("no two adjacent free ports")


@pytest.fixture
def sim_process() -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    base = _free_port_pair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp", "sim", "--servers", "2", "--base-port", str(base), "--profiles", "h100,l4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().split() for _ in range(2)]
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.process
def test_sim_serves_each_server_on_its_port_and_stops_on_sigterm(
    sim_process: tuple[subprocess.Popen[str], list[str]],
) -> None:
    proc, lines = sim_process
    assert [line[0] for line in lines] == ["sim-0", "sim-1"]
    assert [line[2] for line in lines] == ["h100-llama3.1-8b", "l4-llama3.1-8b"]
    for name, address, *_ in lines:
        assert address.startswith("127.0.0.1:")
        body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"http://{address}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.headers["x-sim-server"] == name
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--profiles", "a100"], "unknown profile 'a100'"),
        (["sim", "--servers", "0"], "servers must be positive"),
        (["sim", "--base-port", "65535", "--servers", "2"], "exceed 65535"),
    ],
    ids=["unknown-profile", "no-servers", "ports-out-of-range"],
)
def test_bad_flags_end_with_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.process
def test_sim_publishes_kv_events_on_its_kv_events_ports() -> None:
    from epp.kvevents.feeder import Feeder, KvSource
    from epp.kvevents.index import KvBlockIndex
    from epp.sim.tokens import token_ids

    base, kv = _free_port_pair(), _free_port_pair()
    argv = ["--servers", "2", "--base-port", str(base), "--kv-events-port", str(kv)]
    proc = subprocess.Popen([sys.executable, "-m", "epp", "sim", *argv], stdout=subprocess.PIPE, text=True)
    feeder = Feeder(KvBlockIndex())
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().split() for _ in range(2)]
        assert [line[-1] for line in lines] == [f"kv-events=127.0.0.1:{kv}", f"kv-events=127.0.0.1:{kv + 1}"]
        address = lines[1][1]
        feeder.update([KvSource(line[1], "127.0.0.1", port=int(line[-1].rsplit(":", 1)[1])) for line in lines])
        while (stats := feeder.stats().get(address)) is None or stats.batches == 0:  # until subscribed
            reset = urllib.request.Request(f"http://{address}/reset_prefix_cache", data=b"", method="POST")
            with urllib.request.urlopen(reset, timeout=10):
                pass
            feeder.poll(50)
        prompt = "the same long system prompt, " * 40
        body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": prompt, "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"http://{address}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        keys = feeder.index.request_keys(token_ids(prompt))
        for _ in range(250):
            if feeder.index.match(keys):
                break
            feeder.poll(20)
        assert feeder.index.match(keys) == {address: len(prompt) // 4 // 16}
    finally:
        feeder.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
