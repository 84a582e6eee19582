"""benchmarks/soak.py's in-process driver: whole requests through the picker, checkpoints and a fitted slope."""

from benchmarks.soak import fit, run_inprocess


def test_a_short_soak_reports_checkpoints_and_a_slope() -> None:
    result = run_inprocess(requests=200, every=100, trace=False, warmup=20)
    assert [c["requests"] for c in result["checkpoints"]] == [0, 100, 200]
    assert result["checkpoints"][-1]["prefix_index_blocks"] > 0  # the requests reached the scheduling profile
    assert isinstance(result["slope_b_per_request"], float)


def test_the_slope_is_bytes_per_request() -> None:
    assert fit([(0, 100), (1000, 101)]) == 1024 / 1000  # 1 KiB over 1,000 requests
