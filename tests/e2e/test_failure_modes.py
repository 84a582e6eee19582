"""FailOpen and FailClose through a real Envoy running `epp envoy-config` output, under bounded load, while the
picker is killed with SIGKILL and restarted on the same port.

Each run drives concurrency 16 through three windows of EPP_E2E_FAILURE_LOAD_S / 3 seconds (6 s in all by
default; set it to 20 for the issue's full run): picker up, picker down (SIGKILL), picker restarted on the same
port. Every fourth request carries a forged `x-gateway-destination-endpoint` naming a decoy backend outside the
pool. Latencies are printed, not asserted (the machine is shared); what is asserted is where every request went
and how it was answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.conftest import Backends, Picker, start_picker
from tests.support.procs import ROOT, epp_argv, free_port, http_ok, running, stop, wait_until

CHAT = "/v1/chat/completions"
CONCURRENCY = 16
LOAD_S = float(os.environ.get("EPP_E2E_FAILURE_LOAD_S", "6"))
MAX_REQUESTS = 40_000  # the load stops at whichever bound comes first
# While the restarted picker starts up (seconds on a loaded machine) each worker waits this long between requests:
# refused or balanced by Envoy alone, requests there come back in a millisecond, and at full speed they used up
# MAX_REQUESTS before the picker was ready, leaving no request to check after it.
STARTING_PACE_S = 0.02


@dataclass(frozen=True, slots=True)
class Outcome:
    request_id: str
    started: float
    ended: float
    status: int  # 0: the client saw no HTTP answer at all (connection error)
    served_by: str | None  # the backend's own x-served-by; None when no backend answered
    picker_header: str | None  # the destination header the backend received: None when the picker did not decide
    forged: bool


@dataclass
class Timeline:
    killed: float = 0.0
    restarting: float = 0.0
    ready: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    def down(self) -> list[Outcome]:
        """Requests wholly inside the window where the picker process was dead."""
        return [o for o in self.outcomes if o.started >= self.killed and o.ended <= self.restarting]

    def after_ready(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.started >= self.ready]


class RestartablePicker:
    """`epp serve` on fixed ports, killed with SIGKILL and started again with the same arguments. The picker is a
    process group (the control process, its serving workers, the scrape child): the kill is the group's, as a
    crashed container's. (A control process killed alone leaves its workers to drain what they hold; a stream
    one of them took in the milliseconds before it saw the control process go is still routed, by its last view.)"""

    def __init__(self, argv: list[str], picker: Picker, log: Path) -> None:
        self.argv, self.picker, self.log = argv, picker, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
            )

    def wait_ready(self) -> None:
        wait_until(lambda: http_ok(self.picker.url("/readyz")), 60, "epp serve", self.proc)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def pool_file(tmp: Path, mode: str, backends: Backends) -> Path:
    port = int(backends.pool[0].rsplit(":", 1)[1])
    path = tmp / f"pool-{mode}.yaml"
    path.write_text(
        "apiVersion: inference.networking.k8s.io/v1\n"
        "kind: InferencePool\n"
        f"metadata: {{name: pool-{mode.lower()}, namespace: default}}\n"
        "spec:\n"
        "  selector: {matchLabels: {app: vllm}}\n"
        f"  targetPorts: [{{number: {port}}}]\n"
        f"  endpointPickerRef: {{name: epp, port: {{number: 9002}}, failureMode: {mode}}}\n"
    )
    return path


@dataclass(frozen=True)
class Gateway:
    url: str
    admin: str
    picker: RestartablePicker
    access_log: Path

    def upstreams(self, expected: int) -> dict[str, str | None]:
        """request id → the upstream host Envoy sent it to (None: none), from Envoy's own access log."""
        entries: dict[str, str | None] = {}
        deadline = time.monotonic() + 30  # Envoy flushes its access log about once a second; slower under load
        while time.monotonic() < deadline:
            lines = self.access_log.read_text().splitlines() if self.access_log.exists() else []
            entries = {}
            for line in lines:
                try:  # the last line may be half-written while Envoy flushes
                    entry = json.loads(line)
                except ValueError:
                    continue
                entries[entry["request_id"]] = entry["upstream_host"]
            if len(entries) >= expected:
                break
            time.sleep(0.2)
        return entries


@pytest.fixture(
    params=[("FailOpen", "BUFFERED"), ("FailClose", "BUFFERED"), ("FailClose", "FULL_DUPLEX_STREAMED")],
    ids=["failopen-buffered", "failclose-buffered", "failclose-full-duplex"],
)
def gateway(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, backends: Backends
) -> Iterator[Gateway]:
    mode, body_mode = request.param
    pool = pool_file(e2e_tmp, mode, backends)
    argv, picker_ports = start_picker(e2e_tmp, ",".join(backends.pool), "--pool-file", str(pool))
    picker = RestartablePicker(argv, picker_ports, e2e_tmp / f"picker-{mode}-{body_mode}.log")
    listen, admin = free_port(), free_port()
    config = e2e_tmp / f"envoy-{mode}-{body_mode}.yaml"
    rendered = subprocess.run(
        epp_argv(
            "envoy-config",
            "--pool-file",
            str(pool),
            "--epp",
            f"127.0.0.1:{picker_ports.grpc_port}",
            "--listen",
            f"127.0.0.1:{listen}",
            "--admin",
            f"127.0.0.1:{admin}",
            "--endpoints",
            ",".join(backends.pool),
            "--body-mode",
            body_mode,
            "--access-log",
            str(e2e_tmp / f"access-{mode}-{body_mode}.log"),
            "--output",
            str(config),
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert rendered.returncode == 0, rendered.stderr
    picker.start()
    try:
        picker.wait_ready()
        from epp.gateway.binary import find_envoy

        argv_envoy = [str(find_envoy()), "-c", str(config), "--disable-hot-restart", "-l", "warn", "--concurrency", "1"]
        with running(argv_envoy, e2e_tmp / f"envoy-{mode}-{body_mode}.log") as envoy_proc:
            wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "envoy", envoy_proc)
            yield Gateway(
                f"http://127.0.0.1:{listen}",
                f"http://127.0.0.1:{admin}",
                picker,
                e2e_tmp / f"access-{mode}-{body_mode}.log",
            )
    finally:
        picker.stop()


async def one_request(session: aiohttp.ClientSession, url: str, i: int, forged_to: str) -> Outcome:
    forged = i % 4 == 0
    request_id = f"failure-test-{i}"
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if forged:
        headers["x-gateway-destination-endpoint"] = forged_to
    body = json.dumps({"model": "m1", "messages": [{"role": "user", "content": f"request {i}"}]})
    started = time.monotonic()
    try:
        async with session.post(url + CHAT, data=body, headers=headers) as response:
            payload = await response.read()
            status, served_by = response.status, response.headers.get("x-served-by")
    except (TimeoutError, aiohttp.ClientError):
        return Outcome(request_id, started, time.monotonic(), 0, None, None, forged)
    picker_header = json.loads(payload).get("destination_header") if served_by else None
    return Outcome(request_id, started, time.monotonic(), status, served_by, picker_header, forged)


async def drive(gateway: Gateway, decoy: str) -> Timeline:
    """Load in three windows of LOAD_S/3: picker up, picker killed, picker restarted (counted from when it is
    ready again; paced while it starts). Bounded by MAX_REQUESTS and by a hard deadline even if the picker never
    comes back."""
    timeline = Timeline()
    window = LOAD_S / 3
    hard_deadline = time.monotonic() + LOAD_S + 60
    done = asyncio.Event()
    counter = iter(range(MAX_REQUESTS))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in counter:
            if done.is_set() or time.monotonic() >= hard_deadline:
                return
            if timeline.restarting and not timeline.ready:
                await asyncio.sleep(STARTING_PACE_S)
            timeline.outcomes.append(await one_request(session, gateway.url, i, decoy))

    async def chaos() -> None:
        try:
            await asyncio.sleep(window)
            gateway.picker.kill()
            timeline.killed = time.monotonic()
            await asyncio.sleep(window)
            timeline.restarting = time.monotonic()
            gateway.picker.start()
            await asyncio.to_thread(gateway.picker.wait_ready)
            timeline.ready = time.monotonic()
            await asyncio.sleep(window)
        finally:
            done.set()

    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(chaos(), *(worker(session) for _ in range(CONCURRENCY)))
    return timeline


async def envoy_stats(admin: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as session, session.get(admin + "/stats?format=json") as response:
        data = await response.json(content_type=None)
    return {s["name"]: int(s.get("value", 0)) for s in data["stats"] if "value" in s}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def first_followed(timeline: Timeline) -> float:
    """Seconds from the restart until the first request that the picker routed again."""
    routed = [o.ended for o in timeline.outcomes if o.started >= timeline.restarting and o.picker_header]
    return min(routed) - timeline.restarting if routed else float("nan")


def report(name: str, timeline: Timeline) -> None:
    down = timeline.down()
    span = max(o.ended for o in timeline.outcomes) - min(o.started for o in timeline.outcomes)
    print(
        f"\n[{name}] {len(timeline.outcomes)} requests in {span:.1f}s at c={CONCURRENCY}; "
        f"down window {timeline.restarting - timeline.killed:.2f}s with {len(down)} requests, "
        f"p99 there {p99([o.ended - o.started for o in down]) * 1000:.1f} ms; "
        f"picker ready {timeline.ready - timeline.restarting:.2f}s after restart, routing by it again "
        f"{first_followed(timeline):.2f}s after restart; "
        f"statuses {sorted({o.status for o in timeline.outcomes})}"
    )


async def test_fail_modes_under_load_with_the_picker_killed_and_restarted(
    gateway: Gateway, backends: Backends, request: pytest.FixtureRequest
) -> None:
    fail_open = "failopen" in request.node.callspec.id
    timeline = await drive(gateway, backends.decoy)
    report(request.node.callspec.id, timeline)
    outcomes, down, after = timeline.outcomes, timeline.down(), timeline.after_ready()
    assert down, "no request fell inside the window where the picker was dead"
    assert after, "no request after the picker came back"

    upstreams = await asyncio.to_thread(gateway.upstreams, len(outcomes))
    assert {o.request_id for o in outcomes} <= set(upstreams), "Envoy's access log misses requests"

    # Both modes: the decoy never serves nor is even tried, whatever the client sent and whether the picker is up.
    assert backends.decoy not in set(upstreams.values())
    assert all(o.served_by != backends.decoy for o in outcomes)
    assert any(o.forged for o in down)
    assert {o.served_by for o in outcomes if o.served_by} <= set(backends.pool)

    if fail_open:
        # Zero failed client requests; while the picker was dead, the pool's own balancer served them.
        assert [o for o in outcomes if o.status != 200] == []
        assert all(o.picker_header is None for o in down)
        assert {upstreams[o.request_id] for o in down} <= set(backends.pool)
        # ...because Envoy failed open, not because the picker somehow answered.
        stats = await envoy_stats(gateway.admin)
        assert stats["http.inference.ext_proc.epp.failure_mode_allowed"] >= len(down)
    else:
        # Refused at the gateway with the configured status; nothing was sent to a backend.
        assert {o.status for o in down} == {503}
        assert {upstreams[o.request_id] for o in down} == {None}
        assert all(o.served_by is None for o in down)
        # Fast, not by waiting out the message timeout: the refusals are the picker's failed streams.
        stats = await envoy_stats(gateway.admin)
        assert stats["http.inference.ext_proc.epp.message_timeouts"] == 0
        assert stats["http.inference.ext_proc.epp.streams_failed"] >= len(down)
        assert [o for o in outcomes if o.status not in (200, 503)] == []

    # Both modes: before the kill and once the picker is ready again, every request follows its decision.
    assert all(o.status == 200 and o.picker_header == o.served_by for o in after)
    assert all(o.status == 200 and o.picker_header == o.served_by for o in outcomes if o.ended <= timeline.killed)
