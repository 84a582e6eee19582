"""The receipts' fold (epp.app.receipt_metrics): the counts, sums and histograms a batch of receipts adds are what
one pass over the receipts, one at a time, adds: mixed profiles, receipts without a runner-up or with terms not one
per scorer, KV, token and prefix accounts, ages never known."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.app.receipt_metrics import DATA_AGE, ReceiptMetrics
from epp.observability.plain import PlainHistogram
from epp.scheduling import receipt as receipt_module
from epp.scheduling.receipt import Receipt

_AGES = st.sampled_from([0.0, 0.01, 0.5, 3.0, 1e9, math.inf, math.nan]) | st.floats(0, 400)
_TERMS = st.floats(-10, 10) | st.sampled_from([0.0, -0.0, 1.0])


@st.composite
def receipts(draw: st.DrawFn, names: tuple[str, ...] | None = None) -> Receipt:
    """A receipt of the `names` scorers, with a term each (else of names drawn, now and then one term short)."""
    short = names is None
    if names is None:
        names = draw(st.sampled_from([("a", "b"), ("a", "c", "d"), ()]))
    width = len(names) + (draw(st.sampled_from([0, 0, 0, -1])) if short else 0) if names else 0
    chosen = tuple(draw(st.lists(_TERMS, min_size=width, max_size=width)))
    runner = tuple(draw(st.lists(_TERMS, min_size=width, max_size=width))) if draw(st.booleans()) else ()
    kv = tuple(
        (name, draw(st.sampled_from(["precise", "approximate", "no_tokens"])), 0, 0)
        for name in draw(st.sets(st.sampled_from(["kv1", "kv2"])))
    )
    tokens = tuple((name, draw(st.booleans())) for name in draw(st.sets(st.sampled_from(["t1", "t2"]))))
    prefix = tuple((name, 7, draw(st.integers(0, 3))) for name in draw(st.sets(st.sampled_from(["p1", "p2"]))))
    return Receipt(
        ("p",), "a", "", names, chosen, runner, (), draw(_AGES), 0, 0, kv, draw(_AGES), tokens, prefix
    )  # fmt: skip


def _one_at_a_time(batch: list[Receipt]) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, str], int]]:
    contribution: dict[str, float] = {}
    margin: dict[str, float] = {}
    modes: dict[tuple[str, str], int] = {}
    for r in batch:
        for name in r.scorers:  # every scorer a receipt names has a series, 0 without a full receipt
            contribution.setdefault(name, 0.0)
        if len(r.chosen_terms) == len(r.scorers):
            for name, term in zip(r.scorers, r.chosen_terms, strict=True):
                contribution[name] = contribution.get(name, 0.0) + term
        if len(r.runner_terms) == len(r.scorers) and r.scorers:
            for name, term, other in zip(r.scorers, r.chosen_terms, r.runner_terms, strict=True):
                margin[name] = margin.get(name, 0.0) + (term - other)
        keys = [(n, "precise" if m == "precise" else "approximate") for n, m, _, _ in r.kv]
        keys += [(n, "render" if exact else "estimate") for n, exact in r.tokens]
        keys += [(n, "hit" if reach > 0 else "miss") for n, _, reach in r.prefix]
        for key in keys:
            modes[key] = modes.get(key, 0) + 1
    return contribution, margin, modes


@settings(max_examples=200, deadline=None)
@given(st.lists(receipts(), min_size=1, max_size=40))
def test_a_fold_adds_what_each_receipt_adds(batch: list[Receipt]) -> None:
    sink = ReceiptMetrics()
    for r in batch:
        sink.receipt(r, logged=False)
    sink.snapshot()
    contribution, margin, modes = _one_at_a_time(batch)
    assert sink.receipts == len(batch)
    assert sink.modes == modes
    assert sink.contribution.keys() == contribution.keys()
    assert sink.margin.keys() == margin.keys()
    for name, value in contribution.items():
        assert sink.contribution[name] == pytest.approx(value, abs=1e-9)
    for name, value in margin.items():
        assert sink.margin[name] == pytest.approx(value, abs=1e-9)
    metrics, kv_events = PlainHistogram(DATA_AGE), PlainHistogram(DATA_AGE)
    for r in batch:
        if r.metrics_age_s < math.inf:
            metrics.observe(r.metrics_age_s)
        if r.kv and r.kv_age_s < math.inf:
            kv_events.observe(r.kv_age_s)
    for got, want in ((sink.ages["metrics"], metrics), (sink.ages["kv_events"], kv_events)):
        assert got.counts == want.counts
        assert got.sum == pytest.approx(want.sum)


@st.composite
def batches(draw: st.DrawFn) -> list[Receipt]:
    """Mostly one profile's receipts (the batch the compiled fold takes), now and then a mixed one."""
    if draw(st.integers(0, 3)):
        names = draw(st.sampled_from([("a", "b"), ("a", "c", "d"), (), ("a", "a")]))
        return draw(st.lists(receipts(names), min_size=1, max_size=60))
    return draw(st.lists(receipts(), min_size=1, max_size=40))


@settings(max_examples=300, deadline=None)
@given(batches(), st.lists(_AGES, min_size=2, max_size=2))
def test_the_compiled_fold_is_the_python_definition(batch: list[Receipt], sums: list[float]) -> None:
    """`_fold` (one compiled call for a batch of one profile's receipts) adds what `_fold_python` adds: the same
    counts, the same doubles, onto what the sink held already."""
    compiled, python = ReceiptMetrics(), ReceiptMetrics()
    for sink in (compiled, python):
        sink.contribution["a"] = 0.25
        sink.margin["a"] = -1.5
        sink.modes[("p1", "hit")] = 2
        sink.ages["metrics"].observe(sums[0])
        sink.ages["kv_events"].observe(sums[1])
    compiled.held[:] = batch
    compiled._fold()
    python._fold_python(list(batch))
    assert compiled.receipts == python.receipts == len(batch)
    assert repr(compiled.contribution) == repr(python.contribution)
    assert repr(compiled.margin) == repr(python.margin)
    assert compiled.modes == python.modes
    for signal in ("metrics", "kv_events"):
        assert compiled.ages[signal].counts == python.ages[signal].counts
        assert repr(compiled.ages[signal].sum) == repr(python.ages[signal].sum)


@pytest.mark.skipif(receipt_module._COMPILED is None, reason="the C extension is not built (or EPP_NATIVE=0)")
def test_a_batch_of_one_profile_folds_in_one_compiled_call() -> None:
    r = Receipt(("p",), "a", "b", ("x", "y"), (1.0, 2.0), (0.5, 2.0), (), 0.02, 0, 0, (), math.nan, (), (("q", 7, 1),))
    hist = PlainHistogram(DATA_AGE)
    contribution: dict[str, float] = {}
    margin: dict[str, float] = {}
    modes: dict[tuple[str, str], int] = {}
    args = (contribution, margin, modes, DATA_AGE, hist.counts, list(hist.counts), 0.0, 0.0)
    assert receipt_module.fold_compiled([r, r._replace(runner_terms=())], *args) == (0.04, 0.0)
    assert contribution == {"x": 2.0, "y": 4.0} and margin == {"x": 0.5, "y": 0.0}
    assert modes == {("q", "hit"): 2}
    assert hist.counts[1] == 2  # 0.02: the 0.025 bucket
    assert receipt_module.fold_compiled([r, r._replace(scorers=("x", "z"))], *args) is NotImplemented
