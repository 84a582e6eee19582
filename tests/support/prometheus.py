"""A real Prometheus for tests and the dashboard renderer: Debian's package, its own config and TSDB under a
temporary directory, a free loopback port, stopped by PID.

`make install` unpacks Debian's `prometheus` package (the server and `promtool`) under .venv/prometheus rather
than installing it system-wide: nothing registers a service, so no Prometheus keeps running after a test. A
`prometheus` on PATH (the system package) is used when the unpacked one is absent. Where neither exists the tests
that need it skip with the reason — unless EPP_REQUIRE_PROMETHEUS is set (CI sets it), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.demo.processes import free_port, http_ok, running, wait_until

ROOT = Path(__file__).resolve().parents[2]
UNPACKED = ROOT / ".venv" / "prometheus" / "usr" / "bin"
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Binaries:
    prometheus: Path
    promtool: Path


def find_binaries() -> Binaries | None:
    """The unpacked Debian package's binaries, else the ones on PATH, else None."""
    if (UNPACKED / "prometheus").is_file() and (UNPACKED / "promtool").is_file():
        return Binaries(UNPACKED / "prometheus", UNPACKED / "promtool")
    server, tool = shutil.which("prometheus"), shutil.which("promtool")
    if server and tool:
        return Binaries(Path(server), Path(tool))
    return None


def require_binaries() -> Binaries:
    """The binaries, or skip the test loudly (fail where EPP_REQUIRE_PROMETHEUS says this machine must have them)."""
    found = find_binaries()
    if found is not None:
        return found
    reason = (
        "no Prometheus: `make install` unpacks Debian's prometheus package under .venv/prometheus "
        "(it needs apt-get, and root for `apt-get update` where the package lists are missing)"
    )
    if os.environ.get("EPP_REQUIRE_PROMETHEUS"):
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass(frozen=True, slots=True)
class Prometheus:
    """A running Prometheus's HTTP API."""

    url: str
    scrape_interval_s: float

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (a scalar comes back as one unlabelled sample)."""
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        )
        return list(data["result"])

    def targets_up(self) -> bool:
        """Every scrape target has been scraped at least once, and successfully."""
        active = self._get("/api/v1/targets", {"state": "active"})["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def rules(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/rules", {})["groups"])


def config(targets: Sequence[str], interval_s: float, rule_files: Sequence[Path] = ()) -> dict[str, Any]:
    interval = f"{int(interval_s * 1000)}ms"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "epp", "static_configs": [{"targets": list(targets)}]}],
    }


@contextlib.contextmanager
def prometheus(
    workdir: Path, targets: Sequence[str], interval_s: float = 1.0, rule_files: Sequence[Path] = ()
) -> Iterator[Prometheus]:
    """Prometheus scraping `targets` (host:port, /metrics) every `interval_s`; yielded once it answers queries."""
    binaries = require_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config(targets, interval_s, rule_files), sort_keys=False))
    port = free_port()
    argv = [
        str(binaries.prometheus),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with running(argv, workdir / "prometheus.log", cwd=workdir) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/-/ready"), READY_TIMEOUT_S, "prometheus", proc)
        yield Prometheus(url, interval_s)


def wait_scraped(server: Prometheus, timeout_s: float = 30.0) -> None:
    """Until every target has been scraped successfully (the first scrape lands up to one interval after start)."""
    deadline = time.monotonic() + timeout_s
    while not server.targets_up():
        if time.monotonic() > deadline:
            raise TimeoutError(f"prometheus: targets not up after {timeout_s}s")
        time.sleep(server.scrape_interval_s / 4)
