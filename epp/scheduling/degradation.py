"""Alarms for silent degradation: the smart part of a pick doing nothing while every request still succeeds.

The watch reads route receipts (`epp.scheduling.receipt`), what the scheduler already computed, and follows a
fixed set of (plugin, reason) conditions:

- `constant_output`: a weighted scorer gave every scored candidate 0 (it told them apart by nothing and added
  nothing: a prefix scorer that never matches, a signal it cannot read); equal non-zero terms are not counted, an
  idle pool's load scorers rightly give every endpoint full marks;
- `stale_signal`: a candidate's metrics row is too old to use (`metrics-data-source`), or the precise producer
  distrusts an endpoint whose KV events stopped (work sent, no event since);
- `missing_signal`: a candidate was never scraped, or no endpoint was ever heard from on the KV-events feed;
- `always_fallback`: the precise producer had no engine token ids (precise → approximate for every endpoint), or
  the vllm token producer's render call failed (render → estimate);
- `prefix_never_hits`: the prompt's leading block was seen in a recent prompt, yet the prefix index matched
  nothing anywhere (an LRU too small for the traffic, a block size that changes under it). Only prompts that repeat
  count: a workload of unique prompts is not a broken index (its scorer's output is then constant instead).

Each condition is judged over windows of `window` observations (one per receipt the watch is shown: the director shows
it one pick in `epp.director.director.WATCH_EVERY`, whether receipts are emitted or not; only repeated prompts count
for `prefix_never_hits`): an episode begins when at least `raise_ratio` of a window was bad and ends when at most
`clear_ratio` of one was, so a condition that flickers neither raises nor clears on its own noise. Transitions are
returned to the caller, which logs them and counts episodes. Pure: time is an argument, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from epp.scheduling.receipt import METRICS_SOURCE, Receipt

REASONS = ("constant_output", "stale_signal", "missing_signal", "always_fallback", "prefix_never_hits")
WINDOW = 6  # observations per verdict: 6 × one pick in 32 (the director's sample) = 192 picks, as 48 × 4 were
RAISE_RATIO = 0.8
CLEAR_RATIO = 0.2
RECENT_PROMPTS = 4096  # leading-block hashes remembered per prefix plugin (a repeat is one seen among them)


class Transition(NamedTuple):
    """An episode began (`active`) or ended, at `now`, with the share of the window that was bad."""

    plugin: str
    reason: str
    active: bool
    now: float
    bad_ratio: float
    pool: str = ""  # the watch's pool (a picker of several pools: a watch per pool's director); "": the only one


class _Condition:
    __slots__ = ("active", "bad", "episodes", "plugin", "reason", "seen", "since")

    def __init__(self, plugin: str, reason: str) -> None:
        self.plugin = plugin
        self.reason = reason
        self.active = False
        self.bad = 0
        self.seen = 0
        self.episodes = 0
        self.since = math.nan


class DegradationWatch:
    """The degradation alarms of one director (one pool's) over the (plugin, reason) pairs it was given."""

    def __init__(
        self,
        watched: Iterable[tuple[str, str]],
        window: int = WINDOW,
        raise_ratio: float = RAISE_RATIO,
        clear_ratio: float = CLEAR_RATIO,
        pool: str = "",
    ) -> None:
        """`pool`: the key (`namespace/name`) of the pool whose picks it watches, on its transitions and states;
        "" for a picker of one pool."""
        self.pool = pool
        self.window = window
        self.raise_ratio = raise_ratio
        self.clear_ratio = clear_ratio
        self._conditions: dict[tuple[str, str], _Condition] = {pair: _Condition(*pair) for pair in watched}
        unknown = {reason for _, reason in self._conditions} - set(REASONS)
        if unknown:  # the reason label's values are a fixed set: dashboards and alert rules name them
            raise ValueError(f"unknown degradation reasons: {sorted(unknown)}")
        self._recent: dict[str, dict[int, None]] = {}
        self._stale = self._conditions.get((METRICS_SOURCE, "stale_signal"))
        self._missing = self._conditions.get((METRICS_SOURCE, "missing_signal"))
        self._scorers_key: tuple[str, ...] | None = None
        self._by_scorer: tuple[_Condition | None, ...] = ()

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        return tuple(self._conditions)

    def states(self) -> list[tuple[str, str, bool, int]]:
        """(plugin, reason, active, episodes begun) of every watched pair."""
        return [(p, r, c.active, c.episodes) for (p, r), c in self._conditions.items()]

    def active(self, now: float) -> list[dict[str, object]]:
        """The episodes in progress, for /debug/pool (with its `pool` when the watch has one)."""
        pool = {"pool": self.pool} if self.pool else {}
        return [
            {**pool, "plugin": p, "reason": r, "since_s": round(max(0.0, now - c.since), 3), "episodes": c.episodes}
            for (p, r), c in self._conditions.items()
            if c.active
        ]

    def observe(self, receipt: Receipt, now: float) -> list[Transition]:
        """One receipt's observations; the episodes that began or ended with it (usually none: the shared empty
        list, not to be changed). Called on every receipt read: written for few bytecodes."""
        out = _NONE
        window = self.window
        by_scorer = self._scorer_conditions(receipt.scorers)
        for condition, inert in zip(by_scorer, receipt.constant, strict=False):
            if condition is not None:
                condition.seen += 1
                condition.bad += inert
                if condition.seen >= window:
                    out = self._verdict(condition, now, out)
        for condition, bad in (
            (self._stale, receipt.stale > 0),
            (self._missing, receipt.missing > 0),
        ):
            if condition is not None:
                condition.seen += 1
                condition.bad += bad
                if condition.seen >= window:
                    out = self._verdict(condition, now, out)
        if receipt.kv or receipt.tokens or receipt.prefix:
            out = self._producers(receipt, now, out)
        return out

    def _producers(self, receipt: Receipt, now: float, out: list[Transition]) -> list[Transition]:
        see = self._see
        for name, mode, stale, absent in receipt.kv:
            out = see(name, "stale_signal", stale > 0, now, out)
            # "No endpoint heard from" is the feed's silence; one quiet endpoint (no traffic yet) is not.
            silent = mode != "no_tokens" and absent > 0 and absent >= receipt.candidates
            out = see(name, "missing_signal", silent, now, out)
            out = see(name, "always_fallback", mode == "no_tokens", now, out)
        for name, exact in receipt.tokens:
            out = see(name, "always_fallback", not exact, now, out)
        for name, first, reach in receipt.prefix:
            if first and self._repeated(name, first):
                out = see(name, "prefix_never_hits", reach == 0, now, out)
        return out

    def _scorer_conditions(self, scorers: tuple[str, ...]) -> tuple[_Condition | None, ...]:
        """The scorers' `constant_output` conditions, in the receipt's order (the same tuple object every pick)."""
        if scorers is not self._scorers_key:
            self._scorers_key = scorers
            self._by_scorer = tuple(self._conditions.get((name, "constant_output")) for name in scorers)
        return self._by_scorer

    def _repeated(self, plugin: str, first: int) -> bool:
        recent = self._recent.get(plugin)
        if recent is None:
            recent = self._recent[plugin] = {}
        if first in recent:
            return True
        if len(recent) >= RECENT_PROMPTS:
            del recent[next(iter(recent))]  # the oldest
        recent[first] = None
        return False

    def _see(self, plugin: str, reason: str, bad: bool, now: float, out: list[Transition]) -> list[Transition]:
        condition = self._conditions.get((plugin, reason))
        if condition is None:
            return out
        condition.seen += 1
        condition.bad += bad
        return self._verdict(condition, now, out) if condition.seen >= self.window else out

    def _verdict(self, condition: _Condition, now: float, out: list[Transition]) -> list[Transition]:
        """A window ended: its bad share decides whether an episode begins or ends; the next window starts."""
        ratio = condition.bad / condition.seen
        condition.seen = condition.bad = 0
        if not condition.active and ratio >= self.raise_ratio:
            condition.active = True
            condition.episodes += 1
            condition.since = now
        elif condition.active and ratio <= self.clear_ratio:
            condition.active = False
        else:
            return out
        transition = Transition(condition.plugin, condition.reason, condition.active, now, ratio, self.pool)
        return [*out, transition]


_NONE: list[Transition] = []
