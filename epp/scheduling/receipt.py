"""A route receipt: why one pick chose its endpoint, read from the pick's own state after it ran.

Users of prefix- and KV-aware routing find out late that the smart part did nothing (the KV feed silent, the prefix
index forgetting, the render call always failing): a receipt says, per request, what each weighted scorer gave the
chosen endpoint and the runner-up (weight × score), how old the data was that the chosen endpoint was judged on (its
metrics row, its last KV event), which producer or fallback ran (precise or approximate prefix, rendered or
estimated tokens), the profile(s) and the flow-control wait. The same values feed the aggregated metrics and the
degradation watch (`epp.scheduling.degradation`), so a receipt is also what the alarms are computed from.

`ReceiptReader` is built once per profile runner (it knows the profile's scorers and producers); `read` runs only on
a detailed pick (`ProfileScheduler.run(detailed=True)`: the terms are kept in the pick's state under
`pick_detail.TERMS`). Pure: `state.now`, no I/O; small pools use Python lists, where numpy's per-call cost is more
than the arithmetic.
"""

from __future__ import annotations

import importlib
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, cast

import orjson

from epp.datastore.freshness import Freshness, usable
from epp.datastore.table import FloatArray, IntArray, Snapshot
from epp.scheduling.framework import CycleState, Producer, produced
from epp.scheduling.pick_detail import BUFFERS, SCORED, TERMS
from epp.scheduling.precise import NEVER, PrecisePrefixCacheProducer
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.producers import ApproxPrefixCacheProducer, TokenProducer


class Compiled(Protocol):
    """The extension's functions (epp/scheduling/_receipt.pyi)."""

    ENABLED: int

    def pick_terms(
        self, scored: IntArray, total: FloatArray, primary: int, named: object, rows: FloatArray | None
    ) -> object: ...

    def receipt_json(self, receipt: object) -> object: ...

    def receipt_of(self, *fields: object) -> object: ...

    def account(self, *fields: object) -> object: ...

    def fold(self, *fields: object) -> object: ...

    def account_pick(
        self, plan: list[object], state: CycleState, primary: int, flow_wait_s: float, profiles: object, keep: bool
    ) -> object: ...

    def scored_pairs(self, addresses: object, slots: object, scores: object) -> object: ...

    def signal_health(
        self,
        scraped_at: FloatArray,
        failures: IntArray,
        candidates: IntArray,
        primary: int,
        now: float,
        staleness_s: float,
        max_failures: int,
    ) -> object: ...


_built: Compiled | None
try:  # by name, as epp.scheduling.totals imports its kernels
    _built = cast(Compiled, importlib.import_module("epp.scheduling._receipt"))
except ImportError:  # built without a compiler: the Python code runs
    _built = None

_COMPILED: Compiled | None = _built if _built is not None and _built.ENABLED else None

METRICS_SOURCE = "metrics-data-source"  # upstream's data-source type: the scraped metric rows, as a plugin name


class Receipt(NamedTuple):
    """One pick's account. Addresses, not slots: it outlives the snapshot. Ages in seconds (inf: never)."""

    profiles: tuple[str, ...]
    chosen: str
    runner_up: str  # "" when only one candidate was scored
    scorers: tuple[str, ...]  # weighted scorers, in the profile's order
    chosen_terms: tuple[float, ...]  # weight × score each gave the chosen endpoint
    runner_terms: tuple[float, ...]  # … and the runner-up (empty without one)
    constant: tuple[bool, ...]  # per scorer, inert: a term of 0 for every scored candidate (empty: fewer than 2)
    metrics_age_s: float  # the chosen endpoint's metrics row
    stale: int  # candidates whose metrics rows were scraped but are not usable now (too old, failing)
    missing: int  # candidates never scraped
    kv: tuple[tuple[str, str, int, int], ...]  # (precise producer, mode, stale candidates, absent candidates)
    kv_age_s: float  # the chosen endpoint's last KV event (NaN: no precise producer)
    tokens: tuple[tuple[str, bool], ...]  # (vllm token producer, engine token ids rendered)
    prefix: tuple[tuple[str, int, int], ...]  # (prefix plugin, the prompt's first block hash or 0, longest match)
    candidates: int = 0  # the pick's candidates (before its filters)
    flow_wait_s: float = 0.0

    def json(self) -> str:
        """`json_python`, compiled when it can be (one C call: ~1/5 of a receipt's cost in Python)."""
        if _COMPILED is not None:
            text = _COMPILED.receipt_json(self)
            if text.__class__ is str:
                return text
        return self.json_python()

    def json_python(self) -> str:
        """The definition: the receipt as one compact JSON object (the `envoy.lb` field and the sampled log line);
        floats as they are (rounding each costs more than the rest of the encoding)."""
        runner = self.runner_terms or (None,) * len(self.chosen_terms)
        out: dict[str, object] = {
            "profiles": self.profiles,
            "chosen": self.chosen,
            "runnerUp": self.runner_up or None,
            "scorers": dict(zip(self.scorers, zip(self.chosen_terms, runner, strict=True), strict=True)),
            "metricsAgeS": _age(self.metrics_age_s),
        }
        if self.kv:
            out["prefix"] = {name: mode for name, mode, _, _ in self.kv}
            out["kvEventsAgeS"] = _age(self.kv_age_s)
        if self.tokens:
            out["tokens"] = {name: "render" if exact else "estimate" for name, exact in self.tokens}
        if self.prefix:
            out["prefixHit"] = {name: reach > 0 for name, _, reach in self.prefix}
        if self.flow_wait_s:
            out["flowWaitS"] = self.flow_wait_s
        return orjson.dumps(out).decode()


def _age(seconds: float) -> float | None:
    return seconds if seconds < math.inf else None


class ReceiptReader:
    """What one profile's picks are read for: its scorers (by the runner's terms), its precise producer, its vllm
    token producers, its prefix plugins that look blocks up themselves."""

    def __init__(
        self, profile: str, scorers: Sequence[object], producers: Sequence[Producer], weighted: tuple[str, ...]
    ) -> None:
        """`weighted`: the names of the scorers the runner weighs (weight > 0), in its order: the terms' order."""
        self.profile = profile
        self.scorers = weighted
        self._precise = tuple(p for p in producers if isinstance(p, PrecisePrefixCacheProducer))
        self._tokens = tuple(p.name for p in producers if isinstance(p, TokenProducer) and p.backend == "vllm")
        lookups: list[PrefixCacheScorer | ApproxPrefixCacheProducer] = [
            s for s in scorers if isinstance(s, PrefixCacheScorer)
        ]
        lookups += [p for p in producers if isinstance(p, ApproxPrefixCacheProducer)]
        self._lookups = tuple(lookups)
        self._producing = bool(self._precise or self._tokens or self._lookups)
        # `account`'s one compiled call reads the prefix plugins' lookups from the pick's scratch itself, by their
        # keys: for a reader without precise or token producers whose lookups are these classes' own (a dict get);
        # None: `read` then `Receipt.json`.
        plain = all(type(p).lookup in _SCRATCH_LOOKUPS for p in lookups)
        self._lookup_keys: tuple[tuple[str, str], ...] | None = (
            tuple((p.name, p.scratch_key) for p in lookups)
            if plain and not self._precise and not self._tokens
            else None
        )
        self._profiles = (profile,)
        # The snapshot the signal columns were read from, with them and its slots as memoryviews (as
        # `epp.scheduling.fused` keeps them): the director's snapshot is the table's cached view, the same object
        # pick after pick until membership changes, and a memoryview hands the kernel its buffer for a fraction of
        # numpy's buffer export (~800 instructions an array).
        self._snapshot: Snapshot | None = None
        self._columns: tuple[memoryview, memoryview] | None = None
        self._slots: IntArray | None = None
        self._slots_view: memoryview | None = None
        # The last pick's totals and their memoryview: a random pick's are one read-only array pick after pick.
        self._total: FloatArray | None = None
        self._total_view: memoryview | None = None

    def watched(self) -> list[tuple[str, str]]:
        """The (plugin, reason) pairs the degradation watch follows for this profile."""
        pairs = [(name, "constant_output") for name in self.scorers]
        pairs += [(METRICS_SOURCE, "stale_signal"), (METRICS_SOURCE, "missing_signal")]
        for p in self._precise:
            pairs += [(p.name, "stale_signal"), (p.name, "missing_signal"), (p.name, "always_fallback")]
        pairs += [(name, "always_fallback") for name in self._tokens]
        pairs += [(p.name, "prefix_never_hits") for p in self._lookups]
        return pairs

    def read(self, state: CycleState, primary: int, flow_wait_s: float = 0.0) -> Receipt:
        """`read_python`, in one compiled call where it can be (`_receipt.receipt_of`: a receipt is read on one pick
        in `WATCH_EVERY`, or on every pick with receipts emitted: each bytecode counts)."""
        if _COMPILED is None:
            return self.read_python(state, primary, flow_wait_s)
        kv, kv_age, tokens, prefix = self._produced(state, primary) if self._producing else _NOTHING_PRODUCED
        snapshot = state.snapshot
        columns = self._columns if snapshot is self._snapshot else self._columns_of(snapshot)
        assert columns is not None
        candidates = state.candidates
        scored, total = state.scratch.get(SCORED, _NOT_SCORED)
        named, rows = state.scratch.get(TERMS) or _NO_TERMS
        freshness = state.freshness
        got = _COMPILED.receipt_of(
            Receipt,
            self._profiles,
            snapshot.addresses,
            self.scorers,
            scored,
            total,
            primary,
            named,
            rows,
            columns[0],
            columns[1],
            self._slots_view if candidates is self._slots else candidates,
            state.now,
            freshness.staleness_s,
            freshness.max_failures,
            kv,
            kv_age,
            tokens,
            prefix,
            flow_wait_s,
        )
        return got if got.__class__ is Receipt else self.read_python(state, primary, flow_wait_s)

    def compiled_account(
        self,
        json: bool,
        pairs: bool,
        held: list[Receipt] | None,
        fold_every: int,
        sink: bool,
        entries: tuple[str, str] | None = None,
    ) -> tuple[Callable[..., object], list[object]] | None:
        """`_receipt.account_pick` and its plan: `account` (`json`, `pairs`) and the hand-off to a sink (`sink`: one
        takes every receipt; `held`: its list of receipts not yet folded, which it folds at `fold_every`, or None)
        in one call from the director's `decide`, the pick's state read in C and the snapshot's columns cached in
        the plan (a list: `_receipt.c`'s PLAN_* positions). An emitted receipt paid ~170 bytecodes of Python around
        the compiled `account` (the director's hand-off, this class's argument gathering, the sink's append): ~4k
        instructions. With `entries` (the scores' and the receipt's keys in `envoy.lb`; with `json` and `pairs`
        only), the call answers, in the pairs' place, those two entries as the bytes the answer writes
        (`epp.extproc.messages.lb_entries_python`'s, parsed): no pair tuple made, nor read again by the answer's
        call. None where that call cannot run: no compiled code, or producers whose reads are Python (precise,
        token): the director's `_account` runs."""
        if _COMPILED is None or self._lookup_keys is None:
            return None
        plan: list[object] = [
            Receipt, self._profiles, self.scorers, self._lookup_keys, (SCORED, TERMS, BUFFERS), json, pairs, held,
            fold_every, sink, entries if json and pairs else None, None, None, None, None, None, None, None, None,
            None, None, None,
        ]  # fmt: skip
        return _COMPILED.account_pick, plan

    def account(
        self,
        state: CycleState,
        primary: int,
        flow_wait_s: float = 0.0,
        profiles: tuple[str, ...] | None = None,
        json: bool = False,
        pairs: bool = False,
    ) -> tuple[Receipt, str | None, tuple[tuple[str, float], ...]]:
        """`account_python`, in one compiled call where it can be (`_receipt.account`: the read, the prefix plugins'
        lookups, the JSON and the scores' pairs; every emitted receipt takes it, and each bytecode here costs ~100
        instructions)."""
        keys = self._lookup_keys
        scratch = state.scratch
        if _COMPILED is not None and keys is not None:
            snapshot = state.snapshot
            columns = self._columns if snapshot is self._snapshot else self._columns_of(snapshot)
            assert columns is not None
            candidates = state.candidates
            named, rows = scratch.get(TERMS) or _NO_TERMS
            buffers = scratch.get(BUFFERS)  # the same arrays as memoryviews, where the runner keeps them so
            if buffers is not None:
                scored, total, rows = buffers
            else:
                scored, total = scratch.get(SCORED, _NOT_SCORED)
                if scored is self._slots:  # every slot scored (a random pick's): the cached memoryview
                    scored = self._slots_view
                if total is self._total:  # the same totals array as the last pick's (a random pick's uniform)
                    total = self._total_view
                elif total is not None:
                    self._total, self._total_view = total, total.data
                    total = self._total_view
            freshness = state.freshness
            got = _COMPILED.account(
                Receipt, profiles or self._profiles, snapshot.addresses, self.scorers, scored, total, primary, named,
                rows, columns[0], columns[1], self._slots_view if candidates is self._slots else candidates,
                state.now, freshness.staleness_s, freshness.max_failures, (), math.nan, (), scratch, keys,
                flow_wait_s, json, pairs,
            )  # fmt: skip
            if got.__class__ is tuple:
                receipt, text, scores = got
                if json and text.__class__ is not str:
                    text = receipt.json_python()
                if scores.__class__ is not tuple:
                    scores = _pairs_of(state, True)
                return receipt, text, scores
        receipt = self.read(state, primary, flow_wait_s)
        if profiles is not None:
            receipt = receipt._replace(profiles=profiles)
        return receipt, receipt.json() if json else None, _pairs_of(state, pairs)

    def account_python(
        self,
        state: CycleState,
        primary: int,
        flow_wait_s: float = 0.0,
        profiles: tuple[str, ...] | None = None,
        json: bool = False,
        pairs: bool = False,
    ) -> tuple[Receipt, str | None, tuple[tuple[str, float], ...]]:
        """The definition: the receipt of a detailed pick (`read_python`), of `profiles` when given (a P/D pick
        names every profile it booked); with `json` its JSON (`Receipt.json_python`), else None; with `pairs` the
        (address, weighted score) of every endpoint it scored (`scored_pairs_python`; none when it scored none),
        else ()."""
        receipt = self.read_python(state, primary, flow_wait_s)
        if profiles is not None:
            receipt = receipt._replace(profiles=profiles)
        scored, total = state.scratch.get(SCORED, _NOT_SCORED)
        scores = scored_pairs_python(state.snapshot.addresses, scored, total) if pairs and scored is not None else ()
        return receipt, receipt.json_python() if json else None, scores

    def _columns_of(self, snapshot: Snapshot) -> tuple[memoryview, memoryview]:
        self._snapshot = snapshot
        self._columns = columns = (snapshot.scraped_at.data, snapshot.scrape_failures.data)
        slots = getattr(snapshot, "slot_index", None)  # a Snapshot's; None of a test's stand-in
        self._slots, self._slots_view = slots, (slots.data if slots is not None else None)
        return columns

    def read_python(self, state: CycleState, primary: int, flow_wait_s: float = 0.0) -> Receipt:
        """The definition: the receipt of a detailed pick whose primary slot is `primary` (its steps' definitions:
        `pick_terms_python`, `signal_health_python`)."""
        snapshot = state.snapshot
        addresses = snapshot.addresses
        scratch = state.scratch
        scored, total = scratch.get(SCORED, _NOT_SCORED)
        named: list[tuple[str, bool, float]]
        rows: FloatArray | None
        named, rows = scratch.get(TERMS) or _NO_TERMS
        runner_slot = -1
        chosen_terms: tuple[float, ...] = ()
        runner_terms: tuple[float, ...] = ()
        inert: tuple[bool, ...] = ()
        if scored is not None and scored.size:
            runner_slot, chosen_terms, runner_terms, inert = pick_terms_python(scored, total, primary, named, rows)
        now = state.now
        metrics_age, stale, missing = signal_health_python(snapshot, state.candidates, primary, now, state.freshness)
        kv, kv_age, tokens, prefix = self._produced(state, primary)
        # The tuple's own constructor: Receipt(...) is a Python-level __new__ of 16 arguments (~20 bytecodes).
        return _new_receipt(
            Receipt,
            (
                self._profiles,
                addresses[primary],
                addresses[runner_slot] if runner_slot >= 0 else "",
                self.scorers if len(named) == len(self.scorers) else tuple(t[0] for t in named),
                chosen_terms,
                runner_terms,
                inert,
                metrics_age,
                stale,
                missing,
                kv,
                kv_age,
                tokens,
                prefix,
                int(state.candidates.size),
                flow_wait_s,
            ),
        )

    def _produced(self, state: CycleState, primary: int) -> Produced:
        """What the profile's producers said of this pick: (precise producer, mode, stale, absent) each, the chosen
        endpoint's last KV event's age (NaN: no precise producer), (token producer, rendered) each, (prefix plugin,
        the prompt's first block hash or 0, longest match) each."""
        addresses = state.snapshot.addresses
        now = state.now
        kv: tuple[tuple[str, str, int, int], ...] = ()
        kv_age = math.nan
        for p in self._precise:
            kv += ((p.name, *p.untrusted(state)),)
            last = p.view.last_event_at(addresses[primary])
            kv_age = math.inf if last == NEVER else max(0.0, now - last)
        tokens = (
            tuple((name, bool(getattr(produced(state, name), "exact", False))) for name in self._tokens)
            if self._tokens
            else ()
        )
        prefix: tuple[tuple[str, int, int], ...] = ()
        for plugin in self._lookups:
            found = plugin.lookup(state)
            if found is not None:
                hashes = found[0]
                prefix += ((plugin.name, hashes[0] if hashes else 0, found[2]),)
        return kv, kv_age, tokens, prefix


# (precise producers' modes, the chosen endpoint's KV-event age, token producers' modes, prefix plugins' matches)
Produced = tuple[
    tuple[tuple[str, str, int, int], ...], float, tuple[tuple[str, bool], ...], tuple[tuple[str, int, int], ...]
]
_NOTHING_PRODUCED: Produced = ((), math.nan, (), ())
_NOT_SCORED: tuple[None, None] = (None, None)
_new_receipt = tuple.__new__
_NO_TERMS: tuple[list[tuple[str, bool, float]], None] = ([], None)
# The `lookup`s that are `state.scratch.get(self.scratch_key)`, which `_receipt.account` reads by the key.
_SCRATCH_LOOKUPS = (PrefixCacheScorer.lookup, ApproxPrefixCacheProducer.lookup)


def signal_health_python(
    snapshot: Snapshot, candidates: IntArray, primary: int, now: float, freshness: Freshness
) -> tuple[float, int, int]:
    """The definition: the age of `primary`'s metrics row (inf: never scraped), and how many of `candidates` have
    data that is not usable now (`epp.datastore.freshness.usable`): stale (scraped, but too old or failing) and
    missing (never scraped)."""
    scraped_at = snapshot.scraped_at
    scraped: float = scraped_at.item(primary)
    stale = missing = 0
    ok = usable(scraped_at[candidates], snapshot.scrape_failures[candidates], now, freshness)
    for slot, fine in zip(candidates.tolist(), ok.tolist(), strict=True):
        if not fine:
            if scraped_at[slot] == scraped_at[slot]:
                stale += 1
            else:
                missing += 1
    return now - scraped if scraped == scraped else math.inf, stale, missing


def pick_terms_python(
    scored: IntArray, total: FloatArray, primary: int, named: list[tuple[str, bool, float]], rows: FloatArray | None
) -> tuple[int, tuple[float, ...], tuple[float, ...], tuple[bool, ...]]:
    """The definition: of a detailed pick that scored `scored` (ascending slots, not empty) with `total`, whose
    scorers are `named` (name, has a per-candidate term, constant part) with those terms as the rows of `rows`,
    and whose primary slot is `primary`: (the runner-up's slot or -1, each term the chosen endpoint got, the
    runner-up's, per term whether it was 0 for every candidate); all empty when `primary` was not scored, the last
    two without a runner-up."""
    listed: list[int] = scored.tolist()
    chosen_at = bisect_left(listed, primary)
    if chosen_at >= len(listed) or listed[chosen_at] != primary:
        return -1, (), (), ()
    runner = -1
    if len(listed) > 1:
        totals: list[float] = total.tolist()
        totals[chosen_at] = -math.inf
        runner = totals.index(max(totals))
    chosen_terms: list[float] = []
    runner_terms: list[float] = []
    inert: list[bool] = []
    at = 0
    for _, has_term, constant in named:
        if not has_term:
            chosen_terms.append(constant)
            if runner >= 0:
                runner_terms.append(constant)
                inert.append(constant == 0.0)
            continue
        assert rows is not None
        listed_terms: list[float] = rows[at].tolist()
        at += 1
        chosen_terms.append(constant + listed_terms[chosen_at])
        if runner >= 0:
            runner_terms.append(constant + listed_terms[runner])
            inert.append(constant + max(listed_terms) == 0.0 and constant + min(listed_terms) == 0.0)
    return listed[runner] if runner >= 0 else -1, tuple(chosen_terms), tuple(runner_terms), tuple(inert)


def pick_terms(
    scored: IntArray, total: FloatArray, primary: int, named: list[tuple[str, bool, float]], rows: FloatArray | None
) -> tuple[int, tuple[float, ...], tuple[float, ...], tuple[bool, ...]]:
    """`pick_terms_python`, compiled when it can be."""
    if _COMPILED is not None:
        got = _COMPILED.pick_terms(scored, total, primary, named, rows)
        if got.__class__ is tuple:
            return got
    return pick_terms_python(scored, total, primary, named, rows)


def _pairs_of(state: CycleState, pairs: bool) -> tuple[tuple[str, float], ...]:
    """`account`'s pairs where its compiled call did not write them."""
    scored, total = state.scratch.get(SCORED, _NOT_SCORED)
    return scored_pairs(state.snapshot.addresses, scored, total) if pairs and scored is not None else ()


def scored_pairs_python(
    addresses: Sequence[str], slots: IntArray | memoryview, scores: FloatArray | memoryview
) -> tuple[tuple[str, float], ...]:
    """The definition: (address, weighted score) of every endpoint a detailed pick scored (`slots`, `scores`: its
    `PickDetail`), the `envoy.lb` scores struct's entries and the decision's `scores`."""
    # Plain ints and floats first (`tolist`, one call each): iterating the arrays makes a numpy scalar per element.
    listed: list[int] = slots.tolist()
    values: list[float] = scores.tolist()  # type: ignore[assignment]  # floats here
    return tuple((addresses[slot], score) for slot, score in zip(listed, values, strict=True))


def scored_pairs(
    addresses: Sequence[str], slots: IntArray | memoryview, scores: FloatArray | memoryview
) -> tuple[tuple[str, float], ...]:
    """`scored_pairs_python`, compiled when it can be (a tuple a pair built in Python: ~15k instructions on 8)."""
    if _COMPILED is not None:
        got = _COMPILED.scored_pairs(addresses, slots, scores)
        if got.__class__ is tuple:
            return got
    return scored_pairs_python(addresses, slots, scores)


def fold_compiled(*fields: object) -> object:
    """`_receipt.fold` (`epp.app.receipt_metrics.ReceiptMetrics._fold_python` in one call), NotImplemented without
    the compiled code."""
    return _COMPILED.fold(*fields) if _COMPILED is not None else NotImplemented
