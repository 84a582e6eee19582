"""The heartbeat rule: a site's phase, recomputed by the picker from its last heartbeat and interval.

LLMKube's hub controller writes `status.phase`, but only when a hub runs, and only as often as it reconciles: the
phase on the object may be minutes old. The picker therefore never trusts it and applies the same rule itself, at
decision time, from `lastHeartbeatTime` and `heartbeatIntervalSeconds`:

- no heartbeat → Unreachable;
- age ≤ 3 × interval → Connected; age ≤ 10 × interval → Stale; else Unreachable (boundaries inclusive);
- an interval ≤ 0 means 30 s, an absent one the CRD default (30 s);
- the interval is clamped up to the cadence the edge agent really delivers (30 s since LLMKube v0.9.30), so a
  healthy site that declares 5 s is not reported Stale between its real pushes. The cadence is configurable
  (0 disables the clamp).

A heartbeat from the future (clock skew between the site and the picker) reads as age 0 — Connected — while it
is at most `max_future_skew_s` ahead. Further ahead it reads as Unreachable: LLMKube's hub would call it
Connected, but then a site that dies right after such a push would stay Connected for as long as the skew (an hour
of skew, an hour of routing into a dead site), and a residency router must not route on a liveness claim it
cannot bound. The operator sees the reason in /debug/pool and fixes the site's clock.

Pure: `now` and the heartbeat are numbers on the same clock (the picker's monotonic clock; the watch converts).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

CRD_DEFAULT_INTERVAL_S = 30.0
NON_POSITIVE_INTERVAL_S = 30.0  # LLMKube: an interval ≤ 0 means 30 s
DELIVERED_CADENCE_S = 30.0  # what LLMKube's edge agent (≥ 0.9.30) really pushes
CONNECTED_FACTOR = 3.0
STALE_FACTOR = 10.0


class Phase(enum.Enum):
    CONNECTED = "Connected"
    STALE = "Stale"
    UNREACHABLE = "Unreachable"


@dataclass(frozen=True, slots=True)
class Deadlines:
    """One heartbeat's verdicts over time: Connected in [not_before, connected_until], then Stale until
    stale_until, Unreachable before not_before (a heartbeat too far in the future) and after stale_until."""

    not_before: float
    connected_until: float
    stale_until: float

    def phase(self, now: float) -> Phase:
        if now < self.not_before:
            return Phase.UNREACHABLE
        if now <= self.connected_until:
            return Phase.CONNECTED
        if now <= self.stale_until:
            return Phase.STALE
        return Phase.UNREACHABLE


@dataclass(frozen=True, slots=True)
class PhaseRule:
    """The rule's knobs. The defaults are LLMKube ≥ 0.9.30's behaviour plus our bound on future heartbeats."""

    delivered_cadence_s: float = DELIVERED_CADENCE_S  # clamp the interval up to this; 0 = no clamp
    max_future_skew_s: float = 10.0  # a heartbeat at most this far ahead of `now` reads as age 0

    def effective_interval(self, interval_s: float | None) -> float:
        """The interval the thresholds are multiples of, after the default, the ≤ 0 rule and the clamp."""
        if interval_s is None or math.isnan(interval_s):
            interval = CRD_DEFAULT_INTERVAL_S
        elif interval_s <= 0:
            interval = NON_POSITIVE_INTERVAL_S
        else:
            interval = interval_s
        return max(interval, self.delivered_cadence_s)

    def deadlines(self, last_heartbeat: float | None, interval_s: float | None) -> Deadlines | None:
        """The rule as three instants (None without a heartbeat): what a router caches per site version, so a
        phase at decision time costs two comparisons."""
        if last_heartbeat is None or math.isnan(last_heartbeat):
            return None
        interval = self.effective_interval(interval_s)
        return Deadlines(
            not_before=last_heartbeat - self.max_future_skew_s,
            connected_until=last_heartbeat + CONNECTED_FACTOR * interval,
            stale_until=last_heartbeat + STALE_FACTOR * interval,
        )

    def phase(self, last_heartbeat: float | None, interval_s: float | None, now: float) -> Phase:
        deadlines = self.deadlines(last_heartbeat, interval_s)
        return Phase.UNREACHABLE if deadlines is None else deadlines.phase(now)

    def explain(self, last_heartbeat: float | None, interval_s: float | None, now: float) -> tuple[Phase, str]:
        """The phase and a short reason, for /debug/pool and the logs."""
        phase = self.phase(last_heartbeat, interval_s, now)
        if last_heartbeat is None or math.isnan(last_heartbeat):
            return phase, "no heartbeat"
        age = now - last_heartbeat
        if age < 0:
            if phase is Phase.UNREACHABLE:
                return phase, f"heartbeat {-age:.0f}s in the future (more than the tolerated skew)"
            return phase, f"heartbeat {-age:.0f}s in the future (within the tolerated skew)"
        interval = self.effective_interval(interval_s)
        if phase is Phase.CONNECTED:
            return phase, f"heartbeat {age:.0f}s ago ≤ 3×{interval:g}s"
        if phase is Phase.STALE:
            return phase, f"heartbeat {age:.0f}s ago > 3×{interval:g}s"
        return phase, f"heartbeat {age:.0f}s ago > 10×{interval:g}s"
