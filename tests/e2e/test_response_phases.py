"""Each `epp envoy-config --response-phases` mode through a real Envoy to the real picker (serving workers, its
default): the request is routed, its in-flight booking returns to zero, and the response-side metrics are there
or not as docs/failure-modes.md says — `none` (2 messages per request): neither the response's timing nor its
usage; `headers` (the default, 3): the response's timing, no usage; `body`: both, the usage read from the body.
Envoy's own counter says how many messages each mode costs."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from epp.gateway.binary import find_envoy
from tests.e2e.conftest import Backends, Picker, metrics_when, settled_value
from tests.e2e.test_routing import CHAT, chat, post
from tests.support.procs import ROOT, epp_argv, free_port, http_ok, running, wait_until

REQUESTS = 6
PROMPT_TOKENS = 3  # what the echo backend reports in `usage` for every answer
# ext_proc messages Envoy sends per BUFFERED request: request headers, request body, then the response's.
MESSAGES = {"none": 2, "headers": 3, "body": 4}  # body: one JSON answer is one body message


def _sum(text: str, sample: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{sample}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _processing(text: str) -> float:
    return _sum(text, "llm_d_epp_response_processing_duration_seconds_count")


def _input_tokens(text: str) -> float:
    return _sum(text, "llm_d_epp_request_input_tokens_sum")


def _inflight(picker: Picker) -> int:
    with urllib.request.urlopen(picker.url("/debug/pool"), timeout=5) as r:
        return sum(int(e["inflight"]) for e in json.loads(r.read())["endpoints"])


def _messages_sent(admin: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=ext_proc.epp.stream_msgs_sent", timeout=5) as r:
        return sum(int(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines() if line.strip())


@pytest.fixture(scope="module", params=["none", "headers", "body"])
def phased_gateway(
    request: pytest.FixtureRequest, envoy_available: None, e2e_tmp: Path, backends: Backends, picker: Picker
) -> Iterator[tuple[str, str, int]]:
    phases = str(request.param)
    listen, admin = free_port(), free_port()
    pool = e2e_tmp / "phases-pool.yaml"
    pool.write_text(
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: phases}\n"
        "spec: {selector: {matchLabels: {app: x}}, targetPorts: [{number: 8000}],"
        " endpointPickerRef: {name: epp, failureMode: FailClose}}\n"
    )
    config = e2e_tmp / f"envoy-phases-{phases}.yaml"
    argv = epp_argv(
        "envoy-config", "--pool-file", str(pool), "--epp", f"127.0.0.1:{picker.grpc_port}",
        "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}", "--endpoints", ",".join(backends.pool),
        "--response-phases", phases, "-o", str(config),
    )  # fmt: skip
    rendered = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    envoy_argv = [str(find_envoy()), "-c", str(config), "--disable-hot-restart", "-l", "warn", "--concurrency", "1"]
    with running(envoy_argv, e2e_tmp / f"envoy-phases-{phases}.log") as proc:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 60, "envoy", proc)
        yield phases, f"http://127.0.0.1:{listen}", admin


async def test_each_response_mode_routes_releases_and_reports_what_it_documents(
    phased_gateway: tuple[str, str, int], backends: Backends, picker: Picker
) -> None:
    phases, gateway, admin = phased_gateway
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        processing_before = await settled_value(session, picker, _processing)
        tokens_before = await settled_value(session, picker, _input_tokens)
        sent_before = _messages_sent(admin)
        for i in range(REQUESTS):
            status, _, body = await post(session, gateway + CHAT, chat(f"phases {phases} {i}"))
            assert status == 200, body
            answer = json.loads(body)
            assert answer["served_by"] in backends.pool
            assert answer["destination_header"] == answer["served_by"]  # the picker's choice, not Envoy's
        sent = _messages_sent(admin) - sent_before
        # In-flight bookings end with the stream (none, headers) or with the response (body): all back to zero.
        wait_until(lambda: _inflight(picker) == 0, 10, f"in-flight bookings back to zero ({phases})")
        routed_text = await metrics_when(
            session, picker, lambda t: _processing(t) >= processing_before + (0 if phases == "none" else REQUESTS)
        )
        if phases == "body":
            routed_text = await metrics_when(
                session, picker, lambda t: _input_tokens(t) >= tokens_before + REQUESTS * PROMPT_TOKENS
            )
        processing = await settled_value(session, picker, _processing)
        tokens = await settled_value(session, picker, _input_tokens)
    assert sent == MESSAGES[phases] * REQUESTS, f"{phases}: {sent} messages for {REQUESTS} requests"
    assert processing - processing_before == (0 if phases == "none" else REQUESTS), routed_text[-2000:]
    assert tokens - tokens_before == (REQUESTS * PROMPT_TOKENS if phases == "body" else 0)
