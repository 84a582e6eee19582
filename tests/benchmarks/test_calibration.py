"""The calibration benchmark's parts on a tiny run: every scenario completes, stale data does not freeze."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.calibration import POOLS, main


def test_a_tiny_pool_runs_every_scenario_and_keeps_dispatching_when_stale(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert main(["--pools", "1 × h100-s32", "--requests", "120", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["1 × h100-s32"]["flow-control-self-calibrating.yaml"]
    for case in ("fresh", "one stale", "all stale"):
        assert result["overload"][case]["critical_unserved"] == 0
    assert result["overload"]["all stale"]["dispatched_after_stale"] > 0
    assert set(result["bounds_met"]) >= {"overshoot ≤ 0.5×", "no freeze (dispatched after the data went stale)"}


def test_every_pool_names_known_profiles_with_32_to_600_sequences() -> None:
    from epp.sim.profiles import profile_named

    caps = {profile_named(name).max_num_seqs for pool in POOLS.values() for name in pool}
    assert min(caps) == 32 and max(caps) == 600
    assert {len(pool) for pool in POOLS.values()} == {1, 4, 16}
