"""Serving workers' request series: sent as deltas only when something changed, folded by the control process under
the picker's label caps, and rendered as one process would render the same requests."""

from prometheus_client import CollectorRegistry

from epp.errors import ErrorCode
from epp.observability.labels import MODEL_LIMIT, OVERFLOW
from epp.observability.metrics import PickerMetrics
from epp.observability.worker_series import DeltaSource, SeriesFold


def serve(metrics: PickerMetrics, model: str, at: float, refused: bool = False) -> None:
    """One request (times on exact binary fractions, so sums do not depend on the order of the adds)."""
    metrics.stream_started()
    record = metrics.request_started(at)
    record.request_bytes = 100
    if refused:
        metrics.request_done(ErrorCode.BAD_REQUEST, model, model, record, at + 0.25)
    else:
        metrics.decided(record, at, at + 0.125, model, model, "tenant", None, "127.0.0.1:8000")
        metrics.response_chunk(record, at + 0.25, 64)
        metrics.usage(model, 10, 4, record)
        metrics.request_done(None, model, model, record, at + 0.5)
    metrics.stream_finished("OK", 0.5)


def rendered(metrics: PickerMetrics, fold: SeriesFold | None = None) -> list[tuple[str, list[str]]]:
    state = fold.state() if fold is not None else metrics.snapshot()
    return sorted((f.name, sorted(map(repr, f.samples))) for f in metrics.families(state))


def test_two_workers_folded_render_what_one_process_renders_for_the_same_requests() -> None:
    one = PickerMetrics(CollectorRegistry())
    workers = [PickerMetrics(CollectorRegistry()) for _ in range(2)]
    sources = [DeltaSource(w) for w in workers]
    fold = SeriesFold()
    for i in range(60):
        model = f"m{i % 7}"
        refused = i % 9 == 0
        serve(one, model, float(i), refused)
        serve(workers[i % 2], model, float(i), refused)
        if i % 10 == 0:  # deltas mid-traffic, folded as they come
            for index, source in enumerate(sources):
                delta = source.delta()
                if delta is not None:
                    fold.receive(index, delta)
    for index, source in enumerate(sources):
        delta = source.delta()
        if delta is not None:
            fold.receive(index, delta)
    assert rendered(workers[0], fold) == rendered(one)


def test_an_idle_worker_sends_nothing_and_a_busy_one_only_the_series_that_moved() -> None:
    metrics = PickerMetrics(CollectorRegistry())
    source = DeltaSource(metrics)
    for i in range(5):
        serve(metrics, f"m{i}", float(i))
    first = source.delta()
    assert first is not None and len(first.series) == 5
    assert source.delta() is None  # nothing happened: nothing to send
    serve(metrics, "m3", 10.0)
    second = source.delta()
    assert second is not None and [key[0] for key in second.series] == ["m3"]
    assert second.totals.by_outcome[("routed", "OK")] == 6


def test_the_label_caps_hold_for_the_picker_not_per_worker() -> None:
    """Each worker admits names up to its own caps; the picker shows as many as one process given all the
    requests would (the model cap, the client series' share of the page), the rest as `other`, every request
    counted."""
    workers = [PickerMetrics(CollectorRegistry()) for _ in range(2)]
    one = PickerMetrics(CollectorRegistry())
    fold = SeriesFold()
    for index, metrics in enumerate(workers):
        for i in range(MODEL_LIMIT + 50):
            name = f"w{index}-model-{i}-" + "x" * (180 if i % 2 else 0)
            serve(metrics, name, float(i))
            serve(one, name, float(i))
        delta = DeltaSource(metrics).delta()
        assert delta is not None
        fold.receive(index, delta)
    state, alone = fold.state(), one.snapshot()
    models = {key[0] for key in state.series}
    assert OVERFLOW in models
    assert len(models) == len({key[0] for key in alone.series})
    assert len(models) < len({key[0] for w in workers for key in w.snapshot().series})
    assert sum(s.total for s in state.series.values()) == 2 * (MODEL_LIMIT + 50)
    targets = {target for _, target, _ in state.attempts}
    assert len(targets - {OVERFLOW}) == MODEL_LIMIT
    assert targets == {target for _, target, _ in alone.attempts}


def test_a_worker_that_ended_takes_its_numbers_with_it() -> None:
    metrics = PickerMetrics(CollectorRegistry())
    serve(metrics, "m", 1.0)
    fold = SeriesFold()
    delta = DeltaSource(metrics).delta()
    assert delta is not None
    fold.receive(0, delta)
    assert fold.state().by_outcome[("routed", "OK")] == 1
    fold.forget(0)
    assert fold.state().by_outcome[("routed", "OK")] == 0
