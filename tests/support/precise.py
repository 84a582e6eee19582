"""Upstream's precise prefix-cache sample, as the tests that run it under `epp serve` need it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from epp.sim.server import DEFAULT_MODEL

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
