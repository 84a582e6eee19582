"""Shared test fixtures and the test tiers.

Reference data is committed under tests/data (sources and licences in its SOURCES.md); traces for the benchmarks
and their tests under benchmarks/data.

Tiers, by marker (registered in pyproject.toml):
- unmarked: in-process, the fast tier `make unit` runs (`-m "not e2e and not process"`);
- `process`: the test starts a child process (the picker, Envoy, the simulator, a CLI run...);
- `e2e`: requests go through a real Envoy to a real picker and backends; every test under tests/e2e gets it,
  and every e2e test is a process test too.
A test that starts a process without the `process` marker fails (seen through Python's audit events), so the fast
tier stays in-process as tests are added.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent

# Hypothesis profiles, chosen by EPP_HYPOTHESIS_PROFILE: `epp-ci` (the default, what `make test` runs) and
# `epp-fuzz` (`make fuzz`: long runs of the stateful fuzz tests, which scale their example counts from it).
# No wall-clock checks in either (no deadline, no too-slow health check): these machines are shared, and a slow
# example is not a failure.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("epp-ci", **_UNTIMED)
settings.register_profile("epp-fuzz", max_examples=100_000, **_UNTIMED)
settings.load_profile(os.environ.get("EPP_HYPOTHESIS_PROFILE", "epp-ci"))
DATA = ROOT / "tests" / "data"
E2E = ROOT / "tests" / "e2e"

# Audit events that start a process (multiprocessing's spawn and forkserver methods raise none; epp uses Popen).
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system"})
_spawned: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        program = executable or (argv if isinstance(argv, (str, bytes)) else argv[0])
        _spawned.append(f"{Path(str(program)).name}")
    elif event in SPAWN_EVENTS:
        _spawned.append(event)


sys.addaudithook(_audit)


@pytest.fixture
def reference_data() -> Path:
    return DATA


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.process)
    _spawned.clear()  # whatever collection started belongs to no test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    spawned, _spawned[:] = list(_spawned), []
    report = outcome.get_result()
    if report.failed and item.get_closest_marker("process") is not None:
        _attach_log_tails(item, report)
    if spawned and report.passed and item.get_closest_marker("process") is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process ({', '.join(sorted(set(spawned)))}) during {report.when} "
            "but is not marked `process`: add `pytest.mark.process` so `make unit` stays in-process"
        )


LOG_TAIL_LINES = 40
LOG_TAIL_FILES = 12


def _attach_log_tails(item: pytest.Item, report: pytest.TestReport) -> None:
    """A failed process test's report carries the last lines of the logs its processes wrote (the picker's,
    Envoy's, the simulator's: `running` sends each to a file in the test's temporary folder), newest first: a
    failure on a CI machine, whose folders are gone with it, then says what the processes saw."""
    folders = [v for k, v in getattr(item, "funcargs", {}).items() if k in ("e2e_tmp", "tmp_path") and v is not None]
    logs = sorted(
        {log for folder in folders if isinstance(folder, Path) for log in folder.glob("*.log")},
        key=lambda log: log.stat().st_mtime,
        reverse=True,
    )
    for log in logs[:LOG_TAIL_FILES]:
        try:
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            continue
        if lines:
            report.sections.append((f"last lines of {log.name}", "\n".join(lines)))
