"""Upstream's precise prefix-cache sample, as the tests that run it under `epp serve` need it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from epp.sim.config import DEFAULT_MODEL
from epp.sim.server import SimServer
from tests.support.procs import http_text

SAMPLE = Path(__file__).parents[1] / "data/epp-configs/llmd-router-precise-prefix-cache-config.yaml"


def precise_sample(render_url: str, kv_port: int) -> dict[str, Any]:
    """The sample as shipped, with only its addresses made ours: the render sidecar's URL and the engines'
    KV-events port (a free one, not 5557, so parallel runs cannot cross)."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    for plugin in doc["plugins"]:
        if plugin["type"] == "token-producer":
            plugin["parameters"]["modelName"] = DEFAULT_MODEL
            plugin["parameters"]["vllm"]["url"] = render_url
        if plugin["type"] == "precise-prefix-cache-producer":
            plugin["parameters"]["kvEventsConfig"] = {"podDiscoveryConfig": {"socketPort": kv_port}}
    return doc


async def until_every_publisher_heard(http: aiohttp.ClientSession, metrics: str, sims: Sequence[SimServer]) -> None:
    """ZMQ's slow joiner: reset the (empty) caches until the picker at `metrics` (its /debug/pool) has heard an
    event from every server, within 30 s."""
    deadline = time.monotonic() + 30
    while True:
        kv = json.loads(http_text(f"{metrics}/debug/pool"))["kvEvents"]
        if kv["up"] and None not in [kv["endpoints"].get(s.address, {}).get("lastEventAgeSeconds") for s in sims]:
            return
        assert time.monotonic() < deadline, f"the feeder never heard every publisher: {kv}"
        for server in sims:
            async with http.post(f"http://{server.address}/reset_prefix_cache") as r:
                assert r.status == 200
        await asyncio.sleep(0.2)
