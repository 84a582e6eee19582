"""The four extension points of a scheduling profile (upstream's words) and the per-pick state they share.

A pick runs filters → scorers → picker over *candidate slots* of one endpoint-table snapshot. Every plugin works on
whole numpy columns indexed by the candidate array, so a pick costs a fixed number of vector operations whatever the
pool size. `CycleState` carries what one pick computes once and several plugins read (the prompt's block hashes),
so a 128 KB prompt is hashed once per pick, not once per plugin.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, cast

import numpy as np
import numpy.typing as npt

from epp.datastore import Freshness, Snapshot, usable
from epp.datastore.table import BoolArray, FloatArray, IntArray

_DEFAULT_FRESHNESS = Freshness()


class SchedulingRequest(Protocol):
    """What scheduling reads of a request. Declared here, not imported: the request parser sits in a layer above
    (epp.requests), and `epp.requests.InferenceRequest` satisfies this structurally."""

    @property
    def model(self) -> str: ...

    @property
    def prompt(self) -> str: ...

    @property
    def session_token(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


# Up to this many values, `extremes` reduces a Python list instead of calling numpy: a numpy reduction costs
# thousands of instructions of dispatch, more than the arithmetic of a few dozen values. The one small-pool path.
SMALL_POOL = 32


# (min, max) of the known (non-NaN) values, NaN when none is known; and whether any value is unknown (NaN). A plain
# tuple: built several times per pick, where a NamedTuple's constructor costs a Python call.
Extremes = tuple[float, float, bool]
_NONE_KNOWN: Extremes = (math.nan, math.nan, False)


# The compiled `small_extremes` (epp/scheduling/_native.c): an `Extremes` tuple, or NotImplemented where the Python
# code must answer (no value, a NaN in the sum, another dtype).
_SmallExtremes = Callable[[FloatArray | IntArray], object]


def _compiled_extremes() -> _SmallExtremes | None:
    # By name, as epp.scheduling.totals loads the same module; EPP_NATIVE=0 or no compiler: the list code runs.
    try:
        module = importlib.import_module("epp.scheduling._native")
    except ImportError:
        return None
    return cast(_SmallExtremes, module.small_extremes) if module.ENABLED else None


_SMALL = _compiled_extremes()

# The extremes of recent small arrays, by their bytes (and dtype): the scrape columns (scrape times, failure streaks,
# queues, KV usage) hold still between scrapes while every pick reduces them, so most reductions are one lookup.
# A pure cache of a pure function: the same bytes and dtype give the same answer. Bounded; cleared when full.
_RECENT: dict[bytes, tuple[np.dtype[Any], Extremes]] = {}
_RECENT_MAX = 1024


def extremes(values: FloatArray | IntArray) -> Extremes:
    """`Extremes` of an array: for a pool of a few dozen endpoints `small_extremes` (compiled when it was built:
    one call, no cache to look up), otherwise numpy's reductions, NaN-ignoring ones only when needed."""
    if values.size <= SMALL_POOL:
        if _SMALL is not None:
            found = _SMALL(values)
            if found.__class__ is tuple:
                return found
        return small_extremes(values)
    return _reduced(values)


def small_extremes(values: FloatArray | IntArray) -> Extremes:
    """The definition for a small pool: on a Python list, both ends in one pass (unless a NaN is present: its sum is
    NaN then, and numpy's NaN-ignoring reductions answer), remembered by content (`_RECENT`)."""
    key = values.tobytes()
    recent = _RECENT.get(key)
    if recent is not None and recent[0] is values.dtype:
        return recent[1]
    listed: list[float] = values.tolist()
    total = sum(listed)  # NaN when a value is (an inf − inf sum goes to numpy too, which gets it right)
    found = _reduced(values) if total != total else (min(listed), max(listed), False) if listed else _NONE_KNOWN
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.clear()
    _RECENT[key] = (values.dtype, found)
    return found


def _reduced(values: FloatArray | IntArray) -> Extremes:
    lo = float(np.minimum.reduce(values))
    if lo == lo:
        return lo, float(np.maximum.reduce(values)), False
    return float(np.fmin.reduce(values)), float(np.fmax.reduce(values)), True


class Signal:
    """A per-endpoint load signal that scorers and the saturation filter read through `CycleState.signal`: the
    four class attributes below (an index into the pick's cache, and the snapshot column it reads)."""

    __slots__ = ("column", "index")
    WAITING: ClassVar[Signal]
    RUNNING: ClassVar[Signal]
    KV_USAGE: ClassVar[Signal]
    EFFECTIVE_QUEUE: ClassVar[Signal]  # waiting + own picks since the scrape (`Snapshot.effective_queue`)
    ALL: ClassVar[tuple[Signal, ...]]

    def __init__(self, index: int, column: str) -> None:
        self.index = index
        self.column = column

    def __repr__(self) -> str:
        return f"Signal.{self.column.upper()}"


Signal.WAITING = Signal(0, "waiting")
Signal.RUNNING = Signal(1, "running")
Signal.KV_USAGE = Signal(2, "kv_usage")
Signal.EFFECTIVE_QUEUE = Signal(3, "effective_queue")
Signal.ALL = (Signal.WAITING, Signal.RUNNING, Signal.KV_USAGE, Signal.EFFECTIVE_QUEUE)


class CycleState:
    """One pick's inputs plus what several plugins of the pick read and is computed once: which candidates have
    usable data, each signal over the candidates and its extremes, and a scratch dict (e.g. prompt block hashes)."""

    __slots__ = (
        "_queue",
        "_signals",
        "_usable",
        "_whole",
        "candidates",
        "freshness",
        "now",
        "request",
        "scratch",
        "snapshot",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        candidates: IntArray,
        request: SchedulingRequest,
        now: float,
        freshness: Freshness = _DEFAULT_FRESHNESS,
    ) -> None:
        self.snapshot = snapshot
        self.candidates = candidates
        self.request = request
        self.now = now
        self.freshness = freshness
        self.scratch: dict[str, Any] = {}
        # Candidates are distinct present slots in ascending order; as many as the snapshot has slots means every
        # slot, in order, so a column can be used as is instead of gathered (the common case: no subset hint, no
        # free slots).
        self._whole = candidates.size == snapshot.present.size
        self._usable: tuple[IntArray, BoolArray | None] | None = None
        self._queue: FloatArray | None = None
        self._signals: list[tuple[IntArray, FloatArray, Extremes] | None] = [None] * len(Signal.ALL)

    def usable(self, candidates: IntArray) -> BoolArray | None:
        """Per candidate, whether its data is usable (`epp.datastore.usable`); None when all of them are (the
        common case, decided from the oldest scrape and the longest failure streak without a per-endpoint pass)."""
        cached = self._usable
        if cached is not None and (cached[0] is candidates or (cached[1] is None and cached[0] is self.candidates)):
            return cached[1]  # a filter's subset of all-usable candidates is all usable: no second pass
        snapshot, now, freshness = self.snapshot, self.now, self.freshness
        scraped_at = self.take(snapshot.scraped_at, candidates)
        failures = self.take(snapshot.scrape_failures, candidates)
        oldest, _, never = extremes(scraped_at)
        streak = extremes(failures)[1]
        mask: BoolArray | None = None
        if not usable(math.nan if never else oldest, streak, now, freshness):
            mask = usable(scraped_at, failures, now, freshness)
        self._usable = (candidates, mask)
        return mask

    def signal(self, signal: Signal, candidates: IntArray) -> tuple[FloatArray, Extremes]:
        """A signal's values over `candidates`, NaN (unknown) where the endpoint's data is not usable, and their
        `extremes`; computed once per pick and candidate set. The values are read-only (maybe a snapshot view)."""
        cached = self._signals[signal.index]
        if cached is None or cached[0] is not candidates:
            snapshot = self.snapshot
            if signal is Signal.EFFECTIVE_QUEUE:
                if self._queue is None:  # over the whole table, once per pick whatever the candidate sets
                    self._queue = snapshot.effective_queue()
                column = self._queue
            else:
                column = getattr(snapshot, signal.column)
            values = self.take(column, candidates)
            mask = self.usable(candidates)
            if mask is not None:
                values = np.where(mask, values, math.nan)
            cached = self._signals[signal.index] = (candidates, values, extremes(values))
        return cached[1], cached[2]

    def take(self, column: npt.NDArray[Any], candidates: IntArray) -> npt.NDArray[Any]:
        """`column[candidates]`, without the gather when `candidates` is the whole table. Read-only result."""
        if self._whole and candidates is self.candidates:
            return column
        return column[candidates]


class Plugin(Protocol):
    """Every plugin has the type name it was registered under and the name the config gave it."""

    type_name: str
    name: str


class Filter(Plugin, Protocol):
    """Narrows the candidate slots. Returning an empty array means no candidate fits the request."""

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray: ...


class Scorer(Plugin, Protocol):
    """Scores candidate slots; one float per candidate, in [0, 1], higher is better; a new array (the runner may
    write into it).

    Each scorer applies its own NaN policy (unknown → neutral, documented per scorer). Scorers whose class sets
    `UNIT_INTERVAL = True` guarantee [0, 1] by construction (the property tests check it); the runner clamps any
    other scorer's output, and maps a NaN total to 0, so a scorer bug can bias a pick but never poison it.
    A `LinearScorer` is scored through its `linear` form instead."""

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray: ...


# One scorer's part of a pick's total (`Linear.part`): values, coef, and the fill of a NaN product (None: none).
Term = tuple[FloatArray, float, float | None]


def weighted_term(values: FloatArray, coef: float, fill: float | None) -> FloatArray:
    """values × coef, a new array; with a fill, NaN → fill (and ±inf → ±max float, `np.nan_to_num`)."""
    out: FloatArray = values * coef
    if fill is not None:
        np.nan_to_num(out, copy=False, nan=fill)
    return out


class Linear(NamedTuple):
    """A score as an affine function of one array: scale × values + offset where a value is known, `unknown`
    where it is NaN (None: no value is NaN). `values` None: the score is `offset` everywhere.

    Most scores are one (a min-max normalised column, 1 − a column, a match count over the prompt length), and at
    pool sizes of a few dozen numpy calls cost more than their arithmetic: the runner adds `term(weight)` of each
    scorer to the total with one multiply, and all the offsets at once, instead of every scorer building its score
    and the runner weighting and adding it.
    """

    values: FloatArray | None
    scale: float
    offset: float
    unknown: float | None = None

    def part(self, weight: float) -> Term | None:
        """weight × (score − offset) per candidate as a `Term`; None when that is 0 everywhere."""
        values = self.values
        if values is None or (self.scale == 0.0 and self.unknown is None):
            return None
        unknown = self.unknown
        return values, weight * self.scale, None if unknown is None else weight * (unknown - self.offset)

    def term(self, weight: float) -> FloatArray | None:
        """weight × (score − offset) per candidate, a new array; None when that is 0 everywhere."""
        part = self.part(weight)
        return None if part is None else weighted_term(*part)

    def scores(self, size: int) -> FloatArray:
        """The score itself, per candidate (clamped to [0, 1] against rounding): what `term` adds up to."""
        out = self.term(1.0)
        if out is None:
            return np.full(size, self.offset)
        out += self.offset
        return sanitize(out)


class LinearScorer:
    """Base of the scorers whose score is a `Linear`: `linear` is their one implementation; the runner reads it,
    and `score` (for everything else: tests, tools) is derived from it."""

    type_name: str
    name: str
    UNIT_INTERVAL = True

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.type_name

    def linear(self, state: CycleState, candidates: IntArray) -> Linear:
        raise NotImplementedError

    def score(self, state: CycleState, candidates: IntArray) -> FloatArray:
        return self.linear(state, candidates).scores(candidates.size)


class Picker(Plugin, Protocol):
    """Chooses slots from scored candidates, best first; extra slots are the gateway's fallbacks."""

    def pick(self, state: CycleState, candidates: IntArray, scores: FloatArray) -> Sequence[int]: ...


class PickObserver(Plugin, Protocol):
    """Learns from the final pick (upstream's PreRequest): the prefix index records the prompt's blocks there."""

    def picked(self, state: CycleState, slot: int) -> None: ...


def sanitize(scores: FloatArray) -> FloatArray:
    """Clamp to [0, 1] in place; NaN → 0 (`fmax` prefers the number). Two ufunc calls, no Python-level checks."""
    np.fmax(scores, 0.0, out=scores)
    np.fmin(scores, 1.0, out=scores)
    return scores


class Producer(Plugin, Protocol):
    """Upstream's data producer: runs once per pick, before the filters, and writes what filters and scorers of
    the pick read (a tokenized prompt, per-endpoint prefix matches, in-flight load) into the pick's state under its
    own name (`publish`). Producers run in dependency order (`ORDER`: token producers first, then those reading
    tokens). A producer that also implements `picked` learns from the final pick, as upstream's PreRequest."""

    ORDER: ClassVar[int]

    def produce(self, state: CycleState) -> None: ...


_PRODUCED = "produced:"


def publish(state: CycleState, producer: str, data: object) -> None:
    """Store a producer's output for this pick, keyed by the producer's name (upstream's data key + producer)."""
    state.scratch[_PRODUCED + producer] = data


def produced(state: CycleState, producer: str) -> Any:
    """What the named producer wrote for this pick, or None (not configured, or nothing for this request)."""
    return state.scratch.get(_PRODUCED + producer)


class TokenizedPrompt(NamedTuple):
    """The prompt as tokens (`token-producer`). `data` holds 4 bytes per token, what the prefix producers hash into
    blocks: the engine's token ids as little-endian uint32 (vllm backend), or the prompt's UTF-8 bytes themselves
    (estimate backend: about 4 bytes per token, as upstream's estimator, so its ids are not engine ids)."""

    n_tokens: int
    data: bytes
    exact: bool  # token ids from the engine's tokenizer, not an estimate


class PrefixMatch(NamedTuple):
    """Per-endpoint prefix-cache match of one request (upstream's PrefixCacheMatchInfo), over all snapshot slots:
    `matched[slot]` leading blocks held, out of `total` blocks of `block_tokens` tokens each."""

    matched: FloatArray
    total: int
    block_tokens: int

    def ratio(self, state: CycleState, candidates: IntArray) -> FloatArray:
        """matched / total per candidate (0 when the prompt has no whole block)."""
        if self.total <= 0 or self.matched.size == 0:
            return np.zeros(candidates.size)
        return np.asarray(state.take(self.matched, candidates), dtype=np.float64) / self.total

    def any_hit(self) -> bool:
        return self.total > 0 and self.matched.size > 0 and bool(self.matched.max() > 0)


class InflightLoad(NamedTuple):
    """Per-endpoint load this picker has sent and not seen complete (upstream's InFlightLoad), over all snapshot
    slots; `request_tokens` is what this request adds wherever it goes (its prompt tokens)."""

    requests: IntArray
    tokens: IntArray
    request_tokens: int
