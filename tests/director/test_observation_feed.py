"""The observation feed: each routed request becomes Observations for every learner, with the endpoint as the pick
saw it and what the response cost as the stream timed it: its TTFT at the first byte, the rest when it ends
normally."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from epp.datastore import EndpointInfo, EndpointTable, MetricsSample
from epp.datastore.observations import Observation
from epp.director import Director
from epp.director.decision import Timing
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.requests import ApiKind, InferenceRequest
from epp.scheduling import Scheduler
from tests.extproc.envoy import (
    BODY,
    DecidingStream,
    Mode,
    body_msg,
    headers_msg,
    response_body,
    response_headers,
)
from tests.support.schedulers import RandomScheduler


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Observation] = []

    def observe(self, obs: Observation) -> None:
        self.seen.append(obs)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _setup(learners: tuple[Recorder, ...]) -> tuple[Director, EndpointTable, Clock]:
    table = EndpointTable()
    slot = table.upsert(EndpointInfo(address="127.10.0.1:8000"))
    table.synced = True
    table.record_scrape(slot, MetricsSample(waiting=3.0, running=7.0, kv_usage=0.25), now=99.0)
    clock = Clock()
    scheduler = Scheduler(RandomScheduler(seed=1), learners=learners, uncached=lambda slot, tokens: tokens // 2)
    return Director(table, scheduler, clock=clock), table, clock


def _request() -> InferenceRequest:
    return InferenceRequest(request_id="r", api=ApiKind.COMPLETIONS, model="m", prompt="x" * 400)


def test_a_finished_request_is_observed_with_its_pick_features_and_timing() -> None:
    recorder = Recorder()
    director, table, clock = _setup((recorder,))
    first = director.decide(_request())
    assert first.pick is not None and first.pick.inflight == 0 and first.pick.queue == 3.0
    second = director.decide(_request())  # one more of ours in flight, one more pick since the scrape
    assert second.pick is not None and second.pick.inflight == 1 and second.pick.queue == 4.0
    clock.now = 101.0
    director.complete(first, Timing(0.2, 0.01, 50, True, 0.05))
    director.complete(second)  # no timing: the response did not end normally
    assert len(recorder.seen) == 1
    obs = recorder.seen[0]
    assert obs.address == "127.10.0.1:8000" and obs.finished_at == 101.0
    assert (obs.ttft_s, obs.tpot_s, obs.output_tokens, obs.waited_s) == (0.2, 0.01, 50, 0.05)
    pick = obs.pick
    assert pick.prompt_tokens == 100 and pick.uncached_tokens == 50
    assert (pick.running, pick.kv_usage, pick.picked_at, pick.scrape_age_s) == (7.0, 0.25, 100.0, 1.0)
    assert table.snapshot().inflight.sum() == 0


def test_without_learners_no_pick_features_are_built() -> None:
    director, _, _ = _setup(())
    decision = director.decide(_request())
    assert decision.pick is None
    director.complete(decision, Timing(0.2, 0.01, 50, True, 0.0))


def test_the_stream_times_a_streamed_response_for_the_feed() -> None:
    recorder = Recorder()
    director, _, _ = _setup((recorder,))
    times = iter([0.0, 0.5, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0])
    now = [0.0]

    def stream_clock() -> float:
        now[0] = next(times, now[0])
        return now[0]

    stream = DecidingStream(director, PickerMetrics(CollectorRegistry()), stream_clock, StreamSettings())
    stream.handle(headers_msg(mode=Mode.BUFFERED, response_mode=Mode.STREAMED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers("text/event-stream"))
    stream.handle(response_body(b'data: {"choices": [{"text": "a"}]}\n\n', False))
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}}\n\ndata: [DONE]\n\n'
    stream.handle(response_body(usage, True))
    assert len(recorder.seen) == 2  # the TTFT at the first byte, the rest at the end
    first, end = recorder.seen
    assert first.streaming and first.ttft_s > 0 and math.isnan(first.tpot_s) and first.output_tokens == -1
    assert end.streaming and end.output_tokens == 5 and math.isnan(end.ttft_s)
    assert end.tpot_s > 0 and not math.isnan(end.tpot_s)


def test_a_stream_cut_mid_response_is_observed_up_to_its_first_byte_only() -> None:
    recorder = Recorder()
    director, table, _ = _setup((recorder,))
    stream = DecidingStream(director, PickerMetrics(CollectorRegistry()), lambda: 1.0, StreamSettings())
    stream.handle(headers_msg(mode=Mode.BUFFERED, response_mode=Mode.STREAMED))
    stream.handle(body_msg(BODY, True))
    stream.handle(response_headers("text/event-stream"))
    stream.handle(response_body(b"data: {}\n\n", False))
    stream.close()
    assert len(recorder.seen) == 1 and table.snapshot().inflight.sum() == 0
    assert recorder.seen[0].ttft_s == 0.0 and math.isnan(recorder.seen[0].tpot_s)  # its TTFT came; no TPOT


def test_the_first_byte_feeds_the_ttft_once_and_the_end_feeds_only_what_it_adds() -> None:
    recorder = Recorder()
    director, table, clock = _setup((recorder,))
    decision = director.decide(_request())
    clock.now = 100.5
    director.first_byte(decision, Timing(0.5, math.nan, -1, True, 0.05))
    director.first_byte(decision, Timing(0.6, math.nan, -1, True, 0.05))  # once per decision
    assert len(recorder.seen) == 1
    first = recorder.seen[0]
    assert (first.ttft_s, first.output_tokens, first.waited_s, first.finished_at) == (0.5, -1, 0.05, 100.5)
    assert math.isnan(first.tpot_s) and first.pick == decision.pick
    clock.now = 103.0
    director.complete(decision, Timing(0.5, 0.02, 120, True, 0.05))
    assert len(recorder.seen) == 2
    end = recorder.seen[1]
    assert math.isnan(end.ttft_s) and (end.tpot_s, end.output_tokens, end.finished_at) == (0.02, 120, 103.0)
    assert table.snapshot().inflight.sum() == 0


def test_a_first_byte_without_timing_leaves_the_ttft_to_the_end() -> None:
    recorder = Recorder()
    director, _, _ = _setup((recorder,))
    decision = director.decide(_request())
    director.first_byte(decision)
    assert recorder.seen == []
    director.complete(decision, Timing(0.2, 0.01, 50, True, 0.0))
    assert len(recorder.seen) == 1 and recorder.seen[0].ttft_s == 0.2
