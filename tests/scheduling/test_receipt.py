"""Route receipts: what a pick gave each scorer's share, read from the pick's own state; emitted by the director
only with --emit-route-receipts, read for the degradation watch on a sample of picks otherwise."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.struct_pb2 import Struct

from epp import wire
from epp.app.receipt_metrics import ReceiptMetrics
from epp.datastore import EndpointTable
from epp.director import Director
from epp.director.decision import Decision
from epp.discovery.static import parse_static_endpoints
from epp.extproc.messages import decision_metadata
from epp.requests.openai import ApiKind, InferenceRequest
from epp.scheduling import build_scheduler
from epp.scheduling.receipt import Receipt
from epp.scrape.engines import EngineRegistry, extract
from tests.scrape.vllm_page import vllm_page

ADDRESSES = [f"127.0.0.{i + 1}:8000" for i in range(4)]
NOW = 1000.25


def _table(scraped_at: float = 1000.0) -> EndpointTable:
    table = EndpointTable()
    table.replace_all(parse_static_endpoints(",".join(ADDRESSES), ()))
    table.synced = True
    engine = EngineRegistry().for_engine("vllm")
    for i, address in enumerate(ADDRESSES):
        slot = table.slot_of(address)
        assert slot is not None
        table.record_scrape(slot, extract(vllm_page(waiting=i % 3, running=4 + i), engine).sample, scraped_at)
    return table


def _request(prompt: str = "a shared system prompt, long enough for several blocks " * 8) -> InferenceRequest:
    return InferenceRequest("r", ApiKind.COMPLETIONS, "m", prompt=prompt)


def _director(**kwargs: Any) -> Director:
    return Director(_table(), build_scheduler(None, seed=1), clock=lambda: NOW, **kwargs)


def _scores(decision: Decision) -> dict[str, float]:
    """The decision's scores: its pairs, or the `envoy.lb` entries the receipt's compiled call wrote (the receipt
    there too, the decision's own JSON)."""
    if not decision.metadata:
        return dict(decision.scores)
    assert decision.scores == ()
    entries = Struct.FromString(decision.metadata).fields
    assert entries[wire.ROUTE_RECEIPT_KEY].string_value == decision.receipt
    return {a: v.number_value for a, v in entries[wire.DESTINATION_SCORES_KEY].struct_value.fields.items()}


def test_receipt_accounts_for_the_chosen_endpoint_and_the_runner_up() -> None:
    director = _director(emit_receipts=True)
    director.decide(_request())  # teaches the prefix index: the second pick has a prefix to follow
    decision = director.decide(_request())
    assert decision.receipt is not None
    receipt = json.loads(decision.receipt)
    assert receipt["chosen"] == decision.addresses[0]
    assert receipt["runnerUp"] in ADDRESSES and receipt["runnerUp"] != receipt["chosen"]
    assert set(receipt["scorers"]) == {
        "queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "inflight-load-scorer",
    }  # fmt: skip
    scores = _scores(decision)  # the receipt is a superset of --emit-endpoint-scores
    chosen = sum(c for c, _ in receipt["scorers"].values())
    runner = sum(r for _, r in receipt["scorers"].values())
    assert chosen == pytest.approx(scores[receipt["chosen"]], abs=1e-3)
    assert runner == pytest.approx(scores[receipt["runnerUp"]], abs=1e-3)
    assert chosen >= runner
    assert receipt["scorers"]["prefix-cache-scorer"][0] > 0  # the prefix the first pick left there
    assert receipt["metricsAgeS"] == 0.25
    assert receipt["prefixHit"] == {"prefix-cache-scorer": True}
    assert receipt["profiles"] == ["default"]


def test_receipt_goes_into_envoy_lb_metadata_beside_the_scores() -> None:
    response = pb.ProcessingResponse()
    decision_metadata(response, ADDRESSES[0], ((ADDRESSES[0], 1.5),), '{"chosen":"127.0.0.1:8000"}')
    fields = response.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
    assert fields[wire.ROUTE_RECEIPT_KEY].string_value == '{"chosen":"127.0.0.1:8000"}'
    assert fields[wire.DESTINATION_SCORES_KEY].struct_value.fields[ADDRESSES[0]].number_value == 1.5


def test_receipts_off_by_default_and_read_on_a_sample_for_the_watch() -> None:
    sink = ReceiptMetrics()
    director = _director(receipts=sink, watch_every=4)
    decisions = [director.decide(_request()) for _ in range(8)]
    assert all(d.receipt is None and d.scores == () for d in decisions)
    sink.snapshot()  # held raw until a read folds them
    assert sink.receipts == 2  # one pick in 4
    assert set(sink.contribution) == {
        "queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "inflight-load-scorer",
    }  # fmt: skip


def test_sampled_receipt_log_line_at_info(caplog: pytest.LogCaptureFixture) -> None:
    sink = ReceiptMetrics()
    director = _director(receipts=sink, emit_receipts=True, receipt_log_every=2)
    with caplog.at_level(logging.INFO, logger="epp.receipts"):
        for _ in range(4):
            director.decide(_request())
    lines = [r for r in caplog.records if r.name == "epp.receipts"]
    assert len(lines) == 2 and all(r.levelno == logging.INFO for r in lines)
    assert json.loads(lines[0].getMessage().removeprefix("route receipt "))["chosen"] in ADDRESSES


def test_flow_control_wait_is_on_the_receipt() -> None:
    director = _director(emit_receipts=True)
    decision = director.decide(_request()._replace(queued_s=0.125))
    assert decision.receipt is not None
    assert json.loads(decision.receipt)["flowWaitS"] == 0.125


def test_stale_rows_are_counted_on_the_receipt() -> None:
    table = _table(scraped_at=900.0)  # every row 100 s old: no candidate's data is usable
    director = Director(table, build_scheduler(None, seed=1), clock=lambda: NOW, emit_receipts=True)
    assert director._reader is not None
    decision = director.decide(_request())
    assert decision.receipt is not None
    assert json.loads(decision.receipt)["metricsAgeS"] == 100.25


class _Kept:
    """A receipt sink that keeps what it is handed."""

    def __init__(self) -> None:
        self.receipts: list[Receipt] = []

    def receipt(self, receipt: Receipt, logged: bool) -> None:
        self.receipts.append(receipt)

    def transition(self, transition: object) -> None:
        pass


def test_a_read_receipt_has_every_field_and_counts_unusable_rows() -> None:
    # The reader builds its Receipt by the tuple's own constructor: one value a field, in the fields' order.
    kept = _Kept()
    table = _table(scraped_at=900.0)  # every row 100 s old: scraped, not usable
    Director(table, build_scheduler(None, seed=1), clock=lambda: NOW, emit_receipts=True, receipts=kept).decide(
        _request()
    )
    (receipt,) = kept.receipts
    assert len(receipt) == len(Receipt._fields)
    assert receipt == Receipt(*receipt)
    assert (receipt.stale, receipt.missing, receipt.candidates) == (len(ADDRESSES), 0, len(ADDRESSES))
    assert receipt.metrics_age_s == 100.25


def test_receipt_metrics_families_and_alarm_series_exist_from_start() -> None:
    sink = ReceiptMetrics()
    director = _director(receipts=sink, emit_receipts=True)
    sink.attach(director.watch)
    director.decide(_request())
    names = {f.name: f for f in sink.collect()}
    assert {
        "llm_d_epp_degraded", "llm_d_epp_degraded_episodes", "llm_d_epp_route_receipts",
        "llm_d_epp_scorer_contribution", "llm_d_epp_scorer_margin", "llm_d_epp_pick_producer",
        "llm_d_epp_pick_data_age_seconds",
    } <= set(names)  # fmt: skip
    degraded = {(s.labels["plugin"], s.labels["reason"]): s.value for s in names["llm_d_epp_degraded"].samples}
    assert degraded[("prefix-cache-scorer", "prefix_never_hits")] == 0.0
    assert degraded[("metrics-data-source", "stale_signal")] == 0.0
    assert all(v == 0.0 for v in degraded.values())
