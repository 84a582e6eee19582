"""The latency model's predictions and their error in /metrics, one series per endpoint that has learned."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from epp.app.pool_metrics import LatencyCollector
from epp.config.decode import parse_config
from epp.datastore.observations import Observation, PickFeatures
from epp.scheduling import build_scheduler
from tests.scheduling.test_slo import DOC


def test_predictions_and_their_error_are_exported_per_endpoint() -> None:
    scheduler = build_scheduler(parse_config(DOC, "cfg.yaml"), seed=1)
    (producer,) = scheduler.learners
    for i in range(20):
        pick = PickFeatures(100, 100, 1.0, 2.0, 0.3, 1, 0.0, 0.0)
        producer.observe(Observation(0, "127.10.0.1:8000", pick, 0.2, 0.01, 10, True, 0.0, float(i)))
    registry = CollectorRegistry()
    collector = LatencyCollector.of(scheduler)
    registry.register(collector)
    collector.freeze()
    labels = {"plugin_name": "predicted-latency-producer", "endpoint": "127.10.0.1:8000", "target": "ttft"}
    assert (
        registry.get_sample_value("epp_latency_model_observations_total", {"plugin_name": labels["plugin_name"]}) == 20
    )
    error = registry.get_sample_value("epp_latency_prediction_error_seconds", labels)
    predicted = registry.get_sample_value("epp_latency_predicted_seconds", labels)
    assert error is not None and error >= 0 and predicted is not None and 0 < predicted < 1
    report = producer.model.report()
    assert report["observations"] == 20 and "127.10.0.1:8000" in report["endpoints"]


def test_with_workers_the_control_process_models_are_the_workers_summed() -> None:
    """Each serving worker sends what its models learned with its metrics (`Metrics.learned`, pickled over the
    pipe); the control process's models become their sum: its admitter, /metrics and /debug/pool see them."""
    import pickle

    from epp.app.worker import Metrics
    from epp.datastore import EndpointTable
    from epp.datastore.table import EndpointInfo
    from epp.scheduling.latency_model import absorb_all

    workers = [build_scheduler(parse_config(DOC, "cfg.yaml"), seed=1) for _ in range(2)]
    for w, scheduler in enumerate(workers):
        (producer,) = scheduler.learners
        for i in range(10):
            pick = PickFeatures(100, 100, 1.0, 2.0, 0.3, 1, 0.0, 0.0)
            producer.observe(Observation(w, f"127.10.0.{w + 1}:8000", pick, 0.2, 0.01, 10, True, 0.0, float(i)))
    sent = [
        pickle.loads(pickle.dumps(Metrics(None, b"", (s.learners[0].model.export(),))))  # type: ignore[arg-type]
        for s in workers
    ]
    table = EndpointTable()
    for address in ("127.10.0.2:8000", "127.10.0.1:8000"):  # the control table's slots are its own
        table.upsert(EndpointInfo(address=address))
    control = build_scheduler(parse_config(DOC, "cfg.yaml"), seed=1)
    (producer,) = control.learners
    absorb_all([producer.model], [m.learned for m in sent], table.slot_of)
    report = producer.model.report()
    assert report["observations"] == 20
    assert set(report["endpoints"]) == {"127.10.0.1:8000", "127.10.0.2:8000"}  # type: ignore[arg-type]
    registry = CollectorRegistry()
    collector = LatencyCollector.of(control)
    registry.register(collector)
    collector.freeze()
    labels = {"plugin_name": "predicted-latency-producer", "endpoint": "127.10.0.2:8000", "target": "ttft"}
    assert registry.get_sample_value("epp_latency_prediction_error_seconds", labels) is not None
