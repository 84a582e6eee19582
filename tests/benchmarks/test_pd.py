"""The P/D benchmark's model on a tiny run: every request completes, the decider's share follows its threshold,
and a disaggregated request's decode pays no prefill (its TPOT is not stretched by other prompts' prefills)."""

from __future__ import annotations

import numpy as np

from benchmarks.pd import simulate, workload
from epp.sim.profiles import H100_LLAMA_8B

PD = ("prefill", "prefill", "decode", "decode")


def test_every_request_completes_and_the_threshold_sets_the_pd_share() -> None:
    items = workload("long-prompt", 30, 4.0, seed=1)
    always = simulate(items, PD, 1, H100_LLAMA_8B)
    never = simulate(items, PD, 100_000, H100_LLAMA_8B)
    aggregated = simulate(items, ("both",) * 4, None, H100_LLAMA_8B)
    for r in (always, never, aggregated):
        assert not np.isnan(r.ttft).any()
    assert always.disaggregated == 1.0 and never.disaggregated == 0.0 and aggregated.disaggregated == 0.0
    assert np.nanpercentile(always.tpot, 90) < np.nanpercentile(aggregated.tpot, 90)
