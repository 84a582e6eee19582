"""The demo's summary: what counts as ok, failed and unfinished, and the side-by-side table."""

from __future__ import annotations

import math

from epp.demo.load import NOT_SENT, Outcome
from epp.demo.report import side_by_side, summarise

NAN = math.nan


def _ok(ttft: float, server: str) -> Outcome:
    return Outcome(200, ttft, ttft + 1.0, server)


def test_summary_counts_every_kind_of_outcome_and_reads_hits_from_counter_deltas() -> None:
    outcomes = [_ok(0.1, "sim-0"), _ok(0.3, "sim-0"), _ok(0.2, "sim-1"), Outcome(503, NAN, NAN, ""),
                Outcome(0, NAN, NAN, ""), Outcome(-1, NAN, NAN, ""), NOT_SENT]  # fmt: skip
    s = summarise("picker", outcomes, 2.0, ["sim-0", "sim-1", "sim-2"], before=(100.0, 40.0), after=(300.0, 190.0))
    assert (s.planned, s.ok, s.failed, s.unfinished) == (6, 3, 2, 1)
    assert s.per_server == {"sim-0": 2, "sim-1": 1, "sim-2": 0}
    assert s.throughput == 1.5
    assert s.hit_rate == 0.75


def test_failed_and_unfinished_requests_count_as_the_slowest_not_as_missing() -> None:
    outcomes = [_ok(0.1, "sim-0"), _ok(0.2, "sim-0"), _ok(0.3, "sim-0"),
                Outcome(-1, 0.05, NAN, ""),  # first token came, the stream did not end by the deadline
                Outcome(503, NAN, NAN, "")]  # fmt: skip
    s = summarise("round-robin", outcomes, 1.0, ["sim-0"], (0.0, 0.0), (1.0, 1.0))
    assert math.isclose(s.ttft_p50, 0.2)
    assert math.isinf(s.ttft_p90) and math.isinf(s.e2e_p99)
    assert math.isclose(s.e2e_p50, 1.3)
    assert "timeout" in side_by_side([s])


def test_no_answer_at_all_reads_not_available_rather_than_zero() -> None:
    s = summarise("round-robin", [Outcome(0, NAN, NAN, "")], 1.0, ["sim-0"], (0.0, 0.0), (0.0, 0.0))
    table = side_by_side([s])
    assert "TTFT p90" in table and "n/a" in table
    assert math.isnan(s.hit_rate)


def test_table_puts_phases_side_by_side_with_server_labels() -> None:
    a = summarise("picker", [_ok(0.05, "sim-0")], 1.0, ["sim-0"], (0.0, 0.0), (10.0, 9.0))
    b = summarise("round-robin", [_ok(0.5, "sim-0")], 1.0, ["sim-0"], (10.0, 9.0), (20.0, 10.0))
    lines = side_by_side([a, b], {"sim-0": "sim-0 (h100)"}).splitlines()
    assert lines[0].split() == ["picker", "round-robin"]
    rows = {line[:24].strip(): line[24:].split() for line in lines[2:]}
    assert rows["TTFT p50"] == ["50", "ms", "500", "ms"]
    assert rows["prefix-cache hit rate"] == ["90%", "10%"]
    assert rows["requests on sim-0 (h100)"] == ["1", "1"]
