"""How many serving workers `epp serve` starts by default: the cores this process may use, capped.

A container's CPU limit is not its CPU affinity: Kubernetes enforces `resources.limits.cpu` as a CFS quota
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`) while the process still sees every core of the
node. Starting a worker per visible core there would put many GILs on a quota of a few cores, each throttled
in turn. So the usable cores are the affinity, lowered by the tightest quota on this process's cgroup or any
of its ancestors, rounded *down* to whole cores (at least one): a fractional core that is left over goes to the
control process and the scrape child, which need some CPU too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

# At most this many workers by default (`--workers N` may ask for up to 64): each is a Python process of its own
# (~90 MB resident, shared libraries included), and past 16 the control process's publishing loop and Envoy's
# connections to the picker are shared by too many.
MAX_DEFAULT_WORKERS = 16


def default_workers(cores: int | None = None) -> int:
    """`--workers auto` (the default): the usable cores, at most MAX_DEFAULT_WORKERS."""
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores() if cores is None else cores))


def usable_cores(
    affinity: int | None = None, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int:
    """The cores this process may run on: its CPU affinity, lowered by its cgroup's CPU quota, whole cores."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    limit = cgroup_cpu_limit(proc_cgroup, root)
    cores = affinity if limit is None else min(affinity, max(1, math.floor(limit + 1e-9)))
    return max(1, cores)


def cgroup_cpu_limit(proc_cgroup: Path, root: Path) -> float | None:
    """The tightest CPU quota (in cores) on this process's cgroup and its ancestors; None where none is set or the
    files cannot be read. cgroup v1's `cpu` controller where the process is in one (a hybrid host lists both),
    else the unified v2 hierarchy."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    v2_path, v1_path = "/", None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    if v1_path is not None:
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (root / mount).is_dir():
                return _tightest(root / mount, v1_path, _v1_quota)
        return None
    return _tightest(root, v2_path, _v2_quota)


def _tightest(mount: Path, path: str, quota: Callable[[Path], float | None]) -> float | None:
    """The smallest quota from the process's own cgroup directory up to the mount's root. Inside a container the
    path from /proc may name the host's hierarchy, which is not mounted there: then the mount's root is the
    container's own cgroup and the only directory read."""
    own = mount / path.lstrip("/")
    if not own.is_dir():
        own = mount
    limits = [q for d in (own, *own.parents) if d == mount or mount in d.parents if (q := quota(d)) is not None]
    return min(limits) if limits else None


def _v2_quota(directory: Path) -> float | None:
    """`cpu.max`: "<quota> <period>" in µs, quota "max" for none."""
    try:
        fields = (directory / "cpu.max").read_text().split()
        if not fields or fields[0] == "max":
            return None
        period = int(fields[1]) if len(fields) > 1 else 100_000
        quota = int(fields[0])
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    """`cpu.cfs_quota_us` (-1 for none) over `cpu.cfs_period_us`."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text().strip())
        period = int((directory / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
