"""The default worker count: the CPU affinity, lowered by the container's CPU quota (cgroup v2 `cpu.max`, v1
CFS quota) on the process's cgroup or any ancestor, whole cores, capped. Fake cgroup trees in tmp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epp.app import cores
from epp.app.cores import MAX_DEFAULT_WORKERS, cgroup_cpu_limit, default_workers, usable_cores


def v2_tree(tmp_path: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A unified hierarchy under tmp/cgroup with `cpu.max` files where `limits` says, the process in `own`."""
    root = tmp_path / "cgroup"
    (root / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for directory, text in limits.items():
        (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / directory.lstrip("/") / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::{own}\n")
    return proc, root


def v1_tree(
    tmp_path: Path, own: str, quota: int, period: int = 100_000, mount: str = "cpu,cpuacct"
) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    directory = root / mount / own.lstrip("/")
    directory.mkdir(parents=True)
    (directory / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (directory / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"12:memory:{own}\n4:cpu,cpuacct:{own}\n0::/\n")
    return proc, root


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "max 100000"})
    assert cgroup_cpu_limit(proc, root) is None
    assert usable_cores(12, proc, root) == 12


def test_a_v2_quota_lowers_the_affinity_to_whole_cores(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "250000 100000"})  # limits.cpu: 2500m
    assert cgroup_cpu_limit(proc, root) == 2.5
    assert usable_cores(16, proc, root) == 2  # the half core left is the control process's and the scrape child's


def test_a_quota_never_raises_the_affinity(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "800000 100000"})
    assert usable_cores(4, proc, root) == 4


def test_a_quota_below_one_core_still_gets_one_worker(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "50000 100000"})  # 500m
    assert usable_cores(8, proc, root) == 1


def test_the_tightest_quota_on_the_path_to_the_root_counts(tmp_path: Path) -> None:
    """A pod's limit sits on the pod's cgroup, the container's own may say "max": both are read."""
    own = "/kubepods.slice/pod1/container1"
    proc, root = v2_tree(tmp_path, own, {own: "max 100000", "/kubepods.slice/pod1": "300000 100000"})
    assert cgroup_cpu_limit(proc, root) == 3.0
    assert usable_cores(32, proc, root) == 3


def test_a_host_path_not_mounted_in_the_container_reads_the_mounts_root(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {"/": "200000 100000"})
    proc.write_text("0::/kubepods.slice/pod1/container1\n")  # no cgroup namespace: the host's path
    assert usable_cores(32, proc, root) == 2


def test_a_v1_cfs_quota_counts(tmp_path: Path) -> None:
    proc, root = v1_tree(tmp_path, "/kubepods/pod1/c1", quota=400_000)
    assert cgroup_cpu_limit(proc, root) == 4.0
    assert usable_cores(64, proc, root) == 4


def test_a_v1_quota_of_minus_one_is_no_limit(tmp_path: Path) -> None:
    proc, root = v1_tree(tmp_path, "/", quota=-1, mount="cpu")
    assert cgroup_cpu_limit(proc, root) is None
    assert usable_cores(6, proc, root) == 6


def test_unreadable_or_odd_files_are_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path / "missing-root") is None
    proc, root = v2_tree(tmp_path, "/", {"/": "lots of cpu"})
    assert cgroup_cpu_limit(proc, root) is None
    assert usable_cores(3, proc, root) == 3


def test_the_affinity_is_read_from_the_process_by_default(tmp_path: Path) -> None:
    proc, root = v2_tree(tmp_path, "/", {})
    assert usable_cores(None, proc, root) == len(os.sched_getaffinity(0))


def test_the_default_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_workers(64) == MAX_DEFAULT_WORKERS
    assert default_workers(2) == 2
    monkeypatch.setattr(cores, "usable_cores", lambda: 1)
    assert default_workers() == 1  # one core: the single-process mode
