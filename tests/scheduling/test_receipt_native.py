"""The compiled receipt steps (epp/scheduling/_receipt.c) equal their Python definitions (epp.scheduling.receipt):
the same runner-up and terms of a detailed pick, the same JSON text of a receipt, on random inputs."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import cast

import numpy as np
import orjson
import pytest
from google.protobuf.struct_pb2 import Struct
from hypothesis import given, settings
from hypothesis import strategies as st

from epp import wire
from epp.datastore.freshness import Freshness
from epp.datastore.table import Snapshot
from epp.extproc.messages import lb_entries_python
from epp.scheduling import receipt
from epp.scheduling.receipt import Receipt, pick_terms_python

compiled = receipt._COMPILED
needs_native = pytest.mark.skipif(compiled is None, reason="the C extension is not built (or EPP_NATIVE=0)")

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf, 1e-300, 1e300, 3.0, 1e-5, 1.5e-5, 1e-6, 1e16]
# Short decimals (2.0, 1.125, 0.05: most terms and ages) take the encoder's own path, the others orjson.dumps (from C).
decimal = st.builds(lambda m, e: m / 10**e, st.integers(-(10**15), 10**15), st.integers(0, 12))
number = st.one_of(
    st.sampled_from(_SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    decimal,
    decimal.map(lambda x: x * 3),
)
# Names and addresses with what JSON escapes: quotes, backslashes, control characters, non-ASCII.
text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)


Terms = tuple[np.ndarray, np.ndarray, int, list[tuple[str, bool, float]], np.ndarray | None]


@st.composite
def detailed_picks(draw: st.DrawFn) -> Terms:
    size = draw(st.integers(1, 12))
    scored = np.array(sorted(draw(st.sets(st.integers(0, 40), min_size=size, max_size=size))), dtype=np.int64)
    # Totals are fmax(·, 0) of the weighted sum: never NaN, ties common.
    totals = st.sampled_from([0.0, 1.0, 2.5, 7.0, math.inf]) | st.floats(0, 10)
    total = np.array(draw(st.lists(totals, min_size=size, max_size=size)), dtype=np.float64)
    primary = draw(st.sampled_from([*scored.tolist(), 41, -1]))
    named: list[tuple[str, bool, float]] = []
    values: list[list[float]] = []
    for k in range(draw(st.integers(0, 6))):
        has_term = draw(st.booleans())
        if has_term:
            values.append(draw(st.lists(number, min_size=size, max_size=size)))
        named.append((f"s{k}", has_term, draw(st.sampled_from([0.0, -0.0, 1.0, 2.0]) | st.floats(-10, 10))))
    rows = np.array(values, dtype=np.float64).reshape(len(values), size) if values else None
    return scored, total, primary, named, rows


def _same(a: object, b: object) -> bool:
    """Equal, NaN where NaN, the same sign of zero (repr of the floats)."""
    return repr(a) == repr(b)


@needs_native
@settings(max_examples=300, deadline=None)
@given(detailed_picks())
def test_the_compiled_terms_are_the_python_definition(case: Terms) -> None:
    assert compiled is not None
    got = compiled.pick_terms(*case)
    assert got.__class__ is tuple
    assert _same(got, pick_terms_python(*case))


@needs_native
def test_terms_of_another_shape_run_the_python_code() -> None:
    assert compiled is not None
    scored = np.arange(4, dtype=np.int64)
    total = np.linspace(0, 1, 4)
    named = [("s", True, 0.0)]
    rows = np.linspace(0, 1, 4).reshape(1, 4)
    assert compiled.pick_terms(scored.astype(np.int32), total, 1, named, rows) is NotImplemented
    assert compiled.pick_terms(scored, total.astype(np.float32), 1, named, rows) is NotImplemented
    strided = np.linspace(0, 1, 8).reshape(2, 4)[:, ::2]
    assert compiled.pick_terms(scored[:2], total[:2], 1, named, strided) is NotImplemented
    assert receipt.pick_terms(scored[:2], total[:2], 1, named, strided) == pick_terms_python(
        scored[:2], total[:2], 1, named, strided
    )
    assert compiled.pick_terms(scored, total, 1, [*named, ("t", True, 1.0)], rows) is NotImplemented  # one row short


@st.composite
def receipts(draw: st.DrawFn) -> Receipt:
    k = draw(st.integers(0, 6))
    names = tuple(draw(st.lists(text, min_size=k, max_size=k, unique=True)))
    paired = draw(st.booleans())
    floats = st.lists(number, min_size=k, max_size=k).map(tuple)
    return Receipt(
        profiles=tuple(draw(st.lists(text, min_size=1, max_size=3))),
        chosen=draw(text),
        runner_up=draw(st.just("") | text),
        scorers=names,
        chosen_terms=draw(floats),
        runner_terms=draw(floats) if paired else (),
        constant=(),
        metrics_age_s=draw(number),
        stale=0,
        missing=0,
        kv=tuple(
            draw(
                st.lists(
                    st.tuples(text, st.sampled_from(["precise", "approximate"]) | text, st.just(0), st.just(0)),
                    max_size=2,
                    unique_by=lambda t: t[0],
                )
            )
        ),
        kv_age_s=draw(number),
        tokens=tuple(draw(st.lists(st.tuples(text, st.booleans()), max_size=2, unique_by=lambda t: t[0]))),
        prefix=tuple(
            draw(
                st.lists(
                    st.tuples(text, st.integers(0, 2**64 - 1), st.integers(-3, 10**20)),
                    max_size=2,
                    unique_by=lambda t: t[0],
                )
            )
        ),
        candidates=k,
        flow_wait_s=draw(st.just(0.0) | number),
    )


@needs_native
@settings(max_examples=500, deadline=None)
@given(receipts())
def test_the_compiled_json_is_the_python_definition(r: Receipt) -> None:
    assert compiled is not None
    text_out = compiled.receipt_json(r)
    assert text_out.__class__ is str
    assert text_out == r.json_python()
    assert r.json() == r.json_python()


@needs_native
@settings(max_examples=2000, deadline=None)
@given(number)
def test_a_double_is_written_as_orjson_writes_it(x: float) -> None:
    r = Receipt(("p",), "a", "", ("s",), (x,), (), (), x, 0, 0, (), math.nan, (), ())
    assert orjson.loads(r.json()) == orjson.loads(r.json_python())
    assert r.json() == r.json_python()


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.lists(number, min_size=1, max_size=300))
def test_a_double_written_again_is_written_as_before(xs: list[float]) -> None:
    """The encoder keeps orjson's text of the doubles it wrote by their bits (a pick's terms repeat): a double
    written again, after others that share or take its place, is the definition's text still."""
    for x in [*xs, *reversed(xs), *xs]:
        r = Receipt(("p",), "a", "", ("s",), (x,), (), (), x, 0, 0, (), math.nan, (), ())
        assert r.json() == r.json_python()


@needs_native
@settings(max_examples=100, deadline=None)
@given(st.lists(text, min_size=1, max_size=200))
def test_a_str_written_again_is_written_as_before(names: list[str]) -> None:
    """The encoder keeps the text of the strs it wrote by identity (a pick's names and addresses are the same objects
    pick after pick): a str written again, after others that share or take its place, non-ASCII or escaped ones
    among them, is the definition's text still."""
    for name in [*names, *reversed(names), *names]:
        r = Receipt((name,), name, name, (), (), (), (), 0.5, 0, 0, (), math.nan, (), ())
        assert r.json() == r.json_python()


@needs_native
def test_a_receipt_the_encoder_does_not_take_runs_the_python_code() -> None:
    assert compiled is not None
    twice = Receipt(("p",), "a", "", ("s", "s"), (1.0, 2.0), (), (), 0.0, 0, 0, (), math.nan, (), ())
    assert compiled.receipt_json(twice) is NotImplemented
    assert (
        twice.json()
        == twice.json_python()
        == '{"profiles":["p"],"chosen":"a","runnerUp":null,"scorers":{"s":[2.0,null]},"metricsAgeS":0.0}'
    )
    integer = twice._replace(scorers=("s",), chosen_terms=(1,))
    assert compiled.receipt_json(integer) is NotImplemented
    assert integer.json() == integer.json_python()
    uneven = twice._replace(runner_terms=(1.0,))
    assert compiled.receipt_json(uneven) is NotImplemented
    with pytest.raises(ValueError):
        uneven.json()


@st.composite
def scored_cases(draw: st.DrawFn) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    addresses = tuple(draw(st.lists(text, min_size=1, max_size=12)))
    size = draw(st.integers(0, len(addresses)))
    slots = sorted(draw(st.sets(st.integers(0, len(addresses) - 1), min_size=size, max_size=size)))
    scores = draw(st.lists(number, min_size=size, max_size=size))
    return addresses, np.array(slots, dtype=np.int64), np.array(scores, dtype=np.float64)


@needs_native
@settings(max_examples=300, deadline=None)
@given(scored_cases(), st.booleans())
def test_the_compiled_scored_pairs_are_the_python_definition(
    case: tuple[tuple[str, ...], np.ndarray, np.ndarray], listed: bool
) -> None:
    assert compiled is not None
    addresses, slots, scores = case
    got = compiled.scored_pairs(list(addresses) if listed else addresses, slots, scores)
    assert got.__class__ is tuple
    assert _same(got, receipt.scored_pairs_python(addresses, slots, scores))
    assert all(pair.__class__ is tuple and pair[1].__class__ is float for pair in got)


@needs_native
def test_scored_pairs_of_another_shape_run_the_python_code() -> None:
    assert compiled is not None
    addresses = ("a", "b", "c")
    slots = np.array([0, 2], dtype=np.int64)
    scores = np.array([1.0, 0.5])
    assert compiled.scored_pairs(addresses, slots.astype(np.int32), scores) is NotImplemented
    assert compiled.scored_pairs(addresses, slots, scores.astype(np.float32)) is NotImplemented
    assert compiled.scored_pairs(addresses, slots, scores[:1]) is NotImplemented
    negative = np.array([-1], dtype=np.int64)  # Python's index wraps: the definition answers
    assert compiled.scored_pairs(addresses, negative, scores[:1]) is NotImplemented
    assert receipt.scored_pairs(addresses, negative, scores[:1]) == (("c", 1.0),)
    assert compiled.scored_pairs(addresses, np.array([3], dtype=np.int64), scores[:1]) is NotImplemented
    with pytest.raises(IndexError):
        receipt.scored_pairs(addresses, np.array([3], dtype=np.int64), scores[:1])
    assert compiled.scored_pairs(iter(addresses), slots, scores) is NotImplemented
    assert receipt.scored_pairs(addresses, slots, scores) == (("a", 1.0), ("c", 0.5))


@st.composite
def health_cases(draw: st.DrawFn) -> tuple[SimpleNamespace, np.ndarray, int, float, Freshness]:
    size = draw(st.integers(1, 12))
    ages = st.sampled_from([math.nan, 0.0, 1.0, 2.0, 2.5, 1e9, -1.0]) | st.floats(-5, 50)
    now = draw(st.sampled_from([1000.0, 0.0, 2.0]) | st.floats(-1e6, 1e6))
    scraped_at = np.array([now - a for a in draw(st.lists(ages, min_size=size, max_size=size))], dtype=np.float64)
    failures = np.array(draw(st.lists(st.integers(0, 6), min_size=size, max_size=size)), dtype=np.int64)
    count = draw(st.integers(0, size))
    candidates = np.array(sorted(draw(st.sets(st.integers(0, size - 1), min_size=count, max_size=count))), np.int64)
    primary = draw(st.integers(0, size - 1))
    freshness = Freshness(draw(st.sampled_from([2.0, 0.5, 30.0])), draw(st.integers(1, 5)))
    return SimpleNamespace(scraped_at=scraped_at, scrape_failures=failures), candidates, primary, now, freshness


@needs_native
@settings(max_examples=500, deadline=None)
@given(health_cases())
def test_the_compiled_signal_health_is_the_python_definition(
    case: tuple[SimpleNamespace, np.ndarray, int, float, Freshness],
) -> None:
    assert compiled is not None
    snapshot, candidates, primary, now, freshness = case
    got = compiled.signal_health(
        snapshot.scraped_at,
        snapshot.scrape_failures,
        candidates,
        primary,
        now,
        freshness.staleness_s,
        freshness.max_failures,
    )
    assert got.__class__ is tuple
    assert _same(got, receipt.signal_health_python(cast(Snapshot, snapshot), candidates, primary, now, freshness))


@needs_native
def test_signal_health_of_another_shape_runs_the_python_code() -> None:
    assert compiled is not None
    scraped_at = np.array([10.0, math.nan, 5.0])
    failures = np.array([0, 0, 4], dtype=np.int64)
    candidates = np.array([0, 1, 2], dtype=np.int64)
    args = (10.0, 2.0, 3)
    assert compiled.signal_health(scraped_at, failures, candidates, 0, *args) == (0.0, 1, 1)
    assert compiled.signal_health(scraped_at, failures, candidates, 1, *args) == (math.inf, 1, 1)
    assert compiled.signal_health(scraped_at.astype(np.float32), failures, candidates, 0, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures.astype(np.int32), candidates, 0, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures[:2], candidates, 0, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures, candidates, 3, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures, candidates, -1, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures, np.array([3], np.int64), 0, *args) is NotImplemented
    assert compiled.signal_health(scraped_at, failures, candidates, 0, 10, 2.0, 3) is NotImplemented  # an int now
    snapshot = cast(Snapshot, SimpleNamespace(scraped_at=scraped_at, scrape_failures=failures))
    assert receipt.signal_health_python(snapshot, candidates, 0, 10.0, Freshness(2.0, 3)) == (0.0, 1, 1)


@st.composite
def read_cases(draw: st.DrawFn) -> tuple[receipt.ReceiptReader, SimpleNamespace, int]:
    """A reader and a detailed pick's state over a table of 42 slots (the picks' slots and primaries are below)."""
    scored, total, primary, named, rows = draw(detailed_picks())
    size = 42
    now = draw(st.sampled_from([1000.0, 0.0]) | st.floats(-1e6, 1e6))
    ages = st.sampled_from([math.nan, 0.0, 1.0, 2.5, -1.0]) | st.floats(-5, 50)
    scraped_at = np.array([now - a for a in draw(st.lists(ages, min_size=size, max_size=size))], dtype=np.float64)
    failures = np.array(draw(st.lists(st.integers(0, 6), min_size=size, max_size=size)), dtype=np.int64)
    candidates = np.unique(np.concatenate([scored, np.array(draw(st.lists(st.integers(0, size - 1))), np.int64)]))
    addresses = tuple(draw(st.lists(text, min_size=size, max_size=size)))
    weighted = tuple(name for name, _, _ in named)
    if draw(st.booleans()) and weighted:  # the reader's scorers not the pick's: the Python code names them
        weighted = weighted[1:]
    reader = receipt.ReceiptReader(draw(text), (), (), weighted)
    scratch: dict[str, object] = {}
    if draw(st.integers(0, 5)):  # else not detailed: no terms at all
        scratch[receipt.SCORED] = (scored, total)
        scratch[receipt.TERMS] = (named, rows)
    state = SimpleNamespace(
        snapshot=SimpleNamespace(addresses=addresses, scraped_at=scraped_at, scrape_failures=failures),
        scratch=scratch,
        candidates=candidates,
        now=now,
        freshness=Freshness(draw(st.sampled_from([2.0, 0.5, 30.0])), draw(st.integers(1, 5))),
    )
    return reader, state, primary


@needs_native
@settings(max_examples=500, deadline=None)
@given(read_cases(), number)
def test_the_compiled_read_is_the_python_definition(
    case: tuple[receipt.ReceiptReader, SimpleNamespace, int], flow_wait: float
) -> None:
    reader, state, primary = case
    expected: Receipt | None = None
    try:
        expected = reader.read_python(state, primary, flow_wait)  # type: ignore[arg-type]
    except IndexError:  # a primary outside the table: both raise
        with pytest.raises(IndexError):
            reader.read(state, primary, flow_wait)  # type: ignore[arg-type]
        return
    got = reader.read(state, primary, flow_wait)  # type: ignore[arg-type]
    assert got.__class__ is Receipt
    assert _same(got, expected)


@needs_native
def test_a_read_of_the_usual_shape_is_one_compiled_call() -> None:
    """The path every emitted receipt takes: `receipt_of` answers (not the Python code)."""
    assert compiled is not None
    scored = np.array([0, 2, 3], dtype=np.int64)
    total = np.array([1.0, 3.0, 2.0])
    named = [("a", True, 0.5), ("b", False, 1.0)]
    rows = np.array([[0.0, 2.0, 1.0]])
    args = (scored, total, 2, named, rows, np.array([9.0, 9.5, 9.75, math.nan]), np.zeros(4, np.int64), scored)
    got = compiled.receipt_of(
        Receipt, ("p",), ("w", "x", "y", "z"), ("a", "b"), *args, 10.0, 2.0, 3, (), math.nan, (), (), 0.0
    )
    assert got.__class__ is Receipt
    assert got == Receipt(
        ("p",), "y", "z", ("a", "b"), (2.5, 1.0), (1.5, 1.0), (False, False), 0.25, 0, 1, (), math.nan, (), (), 3, 0.0
    )
    rest = (10.0, 2.0, 3, (), 0.0, (), (), 0.0)
    # The primary outside the addresses; the reader's scorers not the pick's: the Python code answers.
    assert compiled.receipt_of(Receipt, ("p",), ("w",), ("a", "b"), *args, *rest) is NotImplemented
    assert compiled.receipt_of(Receipt, ("p",), ("w", "x", "y", "z"), ("a",), *args, *rest) is NotImplemented


class _Lookup:
    """A prefix plugin whose lookup is its scratch key's get (as PrefixCacheScorer's and the approximate producer's)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scratch_key = f"lookup:{name}"

    def lookup(self, state: SimpleNamespace) -> object:
        return state.scratch.get(self.scratch_key)


@needs_native
@settings(max_examples=500, deadline=None)
@given(read_cases(), number, st.booleans(), st.booleans(), st.booleans(), st.data())
def test_the_compiled_account_is_the_python_definition(
    case: tuple[receipt.ReceiptReader, SimpleNamespace, int],
    flow_wait: float,
    json: bool,
    pd: bool,
    pairs: bool,
    data: st.DataObject,
) -> None:
    """`account` (the read, the prefix plugins' lookups from the scratch, the JSON, the scores' pairs: one call) is
    `account_python`."""
    reader, state, primary = case
    lookups = [_Lookup(name) for name in data.draw(st.lists(st.sampled_from(["p1", "p2", "p3"]), unique=True))]
    for plugin in lookups:
        if data.draw(st.booleans()):  # else the lookup did not run this pick
            hashes = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
            state.scratch[plugin.scratch_key] = (hashes, np.zeros(3), data.draw(st.integers(0, 5)))
    reader._lookups = tuple(lookups)  # type: ignore[assignment]
    reader._lookup_keys = tuple((p.name, p.scratch_key) for p in lookups)
    reader._producing = bool(lookups)
    profiles = ("decode", "prefill") if pd else None
    try:
        expected = reader.account_python(state, primary, flow_wait, profiles, json, pairs)  # type: ignore[arg-type]
    except (IndexError, ValueError) as exc:  # a primary outside the table, terms not one per scorer: both raise
        with pytest.raises(type(exc)):
            reader.account(state, primary, flow_wait, profiles, json, pairs)  # type: ignore[arg-type]
        return
    got = reader.account(state, primary, flow_wait, profiles, json, pairs)  # type: ignore[arg-type]
    assert got[0].__class__ is Receipt
    assert _same(got, expected)


@needs_native
def test_an_account_of_the_usual_shape_is_one_compiled_call() -> None:
    """The path every emitted receipt takes: `account` answers the receipt and its JSON (not the Python code)."""
    assert compiled is not None
    scored = np.array([0, 2, 3], dtype=np.int64)
    args = (scored, np.array([1.0, 3.0, 2.0]), 2, [("a", True, 0.5)], np.array([[0.0, 2.0, 1.0]]))
    columns = (np.array([9.0, 9.5, 9.75, math.nan]), np.zeros(4, np.int64), scored)
    scratch = {"k": ([7, 8], np.zeros(4), 2)}
    got = compiled.account(
        Receipt, ("p",), ("w", "x", "y", "z"), ("a",), *args, *columns, 10.0, 2.0, 3, (), math.nan, (),
        scratch, (("q", "k"),), 0.0, True, True,
    )  # fmt: skip
    assert got.__class__ is tuple
    r, text, pairs = got
    assert pairs == (("w", 1.0), ("y", 3.0), ("z", 2.0))
    assert r == Receipt(
        ("p",), "y", "z", ("a",), (2.5,), (1.5,), (False,), 0.25, 0, 1, (), math.nan, (), (("q", 7, 2),), 3, 0.0
    )
    assert text == r.json_python()
    assert compiled.account(
        Receipt, ("p",), ("w", "x", "y", "z"), ("a",), *args, *columns, 10.0, 2.0, 3, (), math.nan, (),
        {"k": "other"}, (("q", "k"),), 0.0, True, True,
    ) is NotImplemented  # fmt: skip


def _entries_python(pairs: tuple[tuple[str, float], ...], text: str | None, keys: tuple[str, str]) -> Struct:
    """`lb_entries_python`'s Struct, under the keys `keys` (the test's, as the plan takes them)."""
    scores_key, receipt_key = keys
    struct = Struct.FromString(lb_entries_python(pairs, text))
    out = Struct()
    for key, value in struct.fields.items():
        out.fields[{wire.DESTINATION_SCORES_KEY: scores_key, wire.ROUTE_RECEIPT_KEY: receipt_key}[key]].CopyFrom(value)
    return out


@needs_native
@settings(max_examples=500, deadline=None)
@given(read_cases(), number, st.booleans(), st.booleans(), st.booleans(), st.data())
def test_the_compiled_account_and_hand_off_are_the_python_definition(
    case: tuple[receipt.ReceiptReader, SimpleNamespace, int],
    flow_wait: float,
    json: bool,
    pd: bool,
    pairs: bool,
    data: st.DataObject,
) -> None:
    """`account_pick` (the state read in C, `account`, the sink's append: one call from `decide`) answers what
    `account_python` does, and appends its receipt to the sink's held list only when nothing else needs it (not
    kept for the watch or the log, the sink's fold not due); the plan's caches follow the snapshot."""
    reader, state, primary = case
    lookups = [_Lookup(name) for name in data.draw(st.lists(st.sampled_from(["p1", "p2"]), unique=True))]
    for plugin in lookups:
        if data.draw(st.booleans()):
            hashes = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
            state.scratch[plugin.scratch_key] = (hashes, np.zeros(3), data.draw(st.integers(0, 5)))
    reader._lookups = tuple(lookups)  # type: ignore[assignment]
    reader._lookup_keys = tuple((p.name, p.scratch_key) for p in lookups)
    reader._producing = bool(lookups)
    if data.draw(st.booleans()):  # the runner's memoryviews of the detail, as the fused pick keeps them
        detail = state.scratch.get(receipt.SCORED)
        terms = state.scratch.get(receipt.TERMS)
        if detail is not None and terms is not None:
            rows = terms[1]
            state.scratch[receipt.BUFFERS] = (detail[0].data, detail[1].data, rows.data if rows is not None else None)
    if data.draw(st.booleans()):  # the snapshot's slots: every slot scored and a candidate
        state.snapshot.slot_index = state.candidates
    profiles = ("decode", "prefill") if pd else None
    held: list[Receipt] = [Receipt(("x",), "", "", (), (), (), (), 0.0, 0, 0, (), math.nan, (), ())] * data.draw(
        st.integers(0, 3)
    )
    sink = data.draw(st.booleans())
    keep = data.draw(st.booleans())
    fold_every = data.draw(st.integers(1, 5))
    keys = ("x-scores", "x-receipt") if data.draw(st.booleans()) else None  # emitted: the entries' bytes
    entries = keys is not None and json and pairs
    built = reader.compiled_account(json, pairs, held if data.draw(st.integers(0, 4)) else None, fold_every, sink, keys)
    assert built is not None
    call, plan = built
    try:
        expected = reader.account_python(state, primary, flow_wait, profiles, json, pairs)  # type: ignore[arg-type]
    except (IndexError, ValueError) as exc:  # both raise, or the compiled call leaves it to the Python code
        try:
            assert call(plan, state, primary, flow_wait, profiles, keep) is NotImplemented
        except type(exc):
            pass
        return
    before = list(held)
    for _ in range(2):  # the second with the plan's caches filled
        # done there: nothing else needs the receipt, and a sink, if any, only appends it (its fold not due)
        done = not keep and (not sink or (plan[7] is held and len(held) + 1 < fold_every))
        got = call(plan, state, primary, flow_wait, profiles, keep)
        if got is NotImplemented:
            assert reader.account(state, primary, flow_wait, profiles, json, pairs)[1:] == expected[1:]  # type: ignore[arg-type]
            return
        assert got.__class__ is tuple
        if entries:  # the pairs' place: the scores' and the receipt's `envoy.lb` entries, as the definition's
            assert got[-1].__class__ is bytes
            assert Struct.FromString(got[-1]) == _entries_python(expected[2], expected[1], keys)
            got = (*got[:-1], expected[2])
        if len(got) == 3:
            assert not done
            assert got[0].__class__ is Receipt
            assert _same(got, expected)
            assert held == before
        else:
            assert done
            assert _same(got, expected[1:])
            if sink:
                assert len(held) == len(before) + 1
                assert _same(held[-1], expected[0])
            else:
                assert held == before
            before = list(held)


@needs_native
@settings(max_examples=500, deadline=None)
@given(
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=40),
    st.text(st.sampled_from('ab"\\\x01\x1f\x7f é/'), max_size=40),
)
def test_a_long_str_is_escaped_as_orjson_escapes_it(a: str, b: str) -> None:
    """Names and addresses longer than the encoder's eight-byte scan, what needs an escape anywhere in them."""
    assert compiled is not None
    r = Receipt((a, b), b, a + b, ("s",), (1.0,), (), (), 0.0, 0, 0, (), math.nan, (), ())
    assert compiled.receipt_json(r) == r.json_python()
