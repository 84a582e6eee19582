"""Requests' numbers held raw and folded in batches read exactly as one observation per request: every count, every
bucket and every sum (added in the same order), at any scrape, mid-batch included, and summed over workers."""

import random

from prometheus_client import CollectorRegistry, generate_latest

from epp.app.workers import merge_expositions
from epp.errors import ErrorCode
from epp.observability.metrics import FOLD_EVERY, PickerMetrics, RequestRecord

REFUSALS = (ErrorCode.BAD_REQUEST, ErrorCode.SERVICE_UNAVAILABLE, ErrorCode.BODY_TOO_LARGE)


class Objectives:
    """A label source that changes while requests run (priorities, pinned names)."""

    def __init__(self) -> None:
        self.version = 1
        self.priorities = {"batch": -1, "gold": 5}
        self.models = {"m1", "m1-v2"}

    def objectives(self) -> dict[str, int]:
        return dict(self.priorities)

    def configured_models(self) -> set[str]:
        return set(self.models)


def exposition(registry: CollectorRegistry) -> str:
    return "".join(line + "\n" for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


def drive(metrics: list[PickerMetrics], source: Objectives, seed: int, steps: int, scrape_at: set[int]) -> list[str]:
    """The same mixed traffic into each of `metrics` (routed, refused before and after the decision, streamed
    chunks, usage, rewrites, many models and tenants, labels changing); the expositions of each at `scrape_at`."""
    rng = random.Random(seed)
    models = ["m1", "m2", "", "x" * 300] + [f"client-{i}" for i in range(120)]
    running: list[tuple[list[RequestRecord], str, str]] = []
    scrapes: list[str] = []
    now = 1000.0
    for step in range(steps):
        now += rng.random() * 0.01
        roll = rng.random()
        if roll < 0.55 or not running:
            records = [m.request_started(now) for m in metrics]
            size = rng.randrange(0, 5000) if rng.random() < 0.9 else -1
            common = rng.random() < 0.7  # most requests share a series: their sums depend on the order of adds
            model = "m1" if common else rng.choice(models[:4]) if rng.random() < 0.8 else rng.choice(models)
            target = model + "-v2" if model == "m1" and not common and rng.random() < 0.3 else model
            fairness = None if common else rng.choice([None, "tenant-a", "tenant-b", "f" * 300])
            objective = None if common else rng.choice([None, "batch", "gold", "unknown"])
            refused = rng.choice(REFUSALS) if rng.random() < 0.08 else None
            started = now + rng.random() * 0.002
            decided_at = started + rng.random() * 0.003
            address = f"127.10.0.{rng.randrange(1, 9)}:8000"
            for m, record in zip(metrics, records, strict=True):
                if size >= 0:
                    record.request_bytes = size
                if refused is not None:
                    m.request_done(refused, model, model, record, now, fairness, objective)
                    continue
                m.decided(record, started, decided_at, model, target, fairness, objective, address)
            if refused is None:
                running.append((records, model, target))
        elif roll < 0.8:
            records, model, _ = rng.choice(running)
            start = records[0].response_started_at < 0 and rng.random() < 0.5
            streaming, size = rng.random() < 0.6, rng.randrange(1, 900)
            usage = (rng.randrange(0, 3000), rng.randrange(0, 400), rng.choice([-1, 0, 16, 128]))
            report = rng.random() < 0.2
            for m, record in zip(metrics, records, strict=True):
                if start:
                    record.response_started_at, record.streaming = now, streaming
                m.response_chunk(record, now, size)
                if report:
                    m.usage(model, usage[0], usage[1], record, usage[2])
        else:
            records, model, target = running.pop(rng.randrange(len(running)))
            evicted = rng.random() < 0.1
            for m, record in zip(metrics, records, strict=True):
                if evicted:
                    m.request_done(ErrorCode.SERVICE_UNAVAILABLE, model, model, record, now)
                else:
                    m.request_done(None, model, target, record, now)
        extra = rng.random()
        for m in metrics:
            if extra < 0.01:
                m.usage("m2", 7, 9)  # a report without a record
            elif extra < 0.015:
                m.request_done(None, "m1", "m1")
        if rng.random() < 0.003:
            source.version += 1
            source.priorities["batch"] = rng.randrange(-3, 3)
            source.models.add(f"client-{rng.randrange(120)}")
        if step in scrape_at:
            scrapes += [exposition(m.registry) for m in metrics]
    return scrapes


def test_scrapes_mid_batch_and_at_the_end_read_as_if_every_request_was_observed_at_once() -> None:
    source = Objectives()
    batch_sizes = (1, 7, FOLD_EVERY)  # 1: each number folded the moment it is reported
    metrics = [PickerMetrics(CollectorRegistry(), labels=source, fold_every=n) for n in batch_sizes]
    scrape_at = {0, 5, 130, 255, 256, 257, 1111, 2999}  # none a multiple of both batch sizes: mid-batch scrapes
    scrapes = drive(metrics, source, seed=7, steps=3000, scrape_at=scrape_at)
    assert len(scrapes) == len(scrape_at) * len(batch_sizes)
    for at in range(0, len(scrapes), len(batch_sizes)):
        eager, *batched = scrapes[at : at + len(batch_sizes)]
        assert "llm_d_epp_request_duration_seconds_bucket" in eager or at == 0
        for text in batched:
            assert text == eager


def test_a_scrape_between_folds_shows_every_request_that_ended() -> None:
    metrics = PickerMetrics(CollectorRegistry())
    for i in range(3):  # far fewer than a batch
        record = metrics.request_started(10.0 + i)
        metrics.decided(record, 10.0006 + i, 10.001 + i, "m1", "m1", None, None, "127.10.0.1:8000")
        metrics.request_done(None, "m1", "m1", record, 10.5 + i)
    value = metrics.registry.get_sample_value
    labels = {"model_name": "m1", "target_model_name": "m1", "fairness_id": "default-flow", "priority": "0"}
    assert value("llm_d_epp_request_duration_seconds_count", labels) == 3
    assert value("llm_d_epp_request_duration_seconds_sum", labels) == 0.5 + 0.5 + 0.5
    assert value("llm_d_epp_scheduler_e2e_duration_seconds_count") == 3
    assert value("llm_d_epp_request_running", labels) == 0
    assert value("epp_requests_total", {"outcome": "routed", "code": "OK"}) == 3


def test_worker_expositions_summed_by_the_control_process_read_as_eager_workers_summed() -> None:
    """`epp serve --workers`: each worker sends its exposition (a scrape of its own metrics, mid-batch), the control
    process sums them; the sum is the one workers observing every number at once would give."""
    merged = []
    for fold_every in (1, FOLD_EVERY):
        texts = []
        for worker in range(2):
            source = Objectives()
            metrics = PickerMetrics(CollectorRegistry(), labels=source, fold_every=fold_every)
            texts += [s.encode() for s in drive([metrics], source, seed=worker, steps=700, scrape_at={699})]
        merged.append(sorted((f.name, sorted(map(repr, f.samples))) for f in merge_expositions(texts)))
    eager, batched = merged
    assert batched == eager
    assert any(name == "llm_d_epp_request_duration_seconds" for name, _ in eager)
