"""Engine profiles with another batch cap: `<profile>-s<max-num-seqs>`."""

from __future__ import annotations

import pytest

from epp.sim.engine import Engine, SimRequest
from epp.sim.profiles import H100_LLAMA_8B, L4_LLAMA_8B, profile_named, with_max_num_seqs


def test_a_named_batch_cap_changes_only_max_num_seqs() -> None:
    small, big = profile_named("h100-s32"), profile_named("l4-s600")
    assert (small.max_num_seqs, small.num_blocks, small.name) == (32, H100_LLAMA_8B.num_blocks, "h100-llama3.1-8b-s32")
    assert (big.max_num_seqs, big.prefill_s_per_token) == (600, L4_LLAMA_8B.prefill_s_per_token)
    assert profile_named("h100") is H100_LLAMA_8B


@pytest.mark.parametrize("name", ["h100-s0", "h100-sx", "a100-s32", "h100-s99999"])
def test_a_bad_name_or_cap_is_refused(name: str) -> None:
    with pytest.raises(ValueError):
        profile_named(name)


def test_the_engine_admits_no_more_than_its_cap() -> None:
    engine = Engine(with_max_num_seqs(H100_LLAMA_8B, 4))
    for i in range(6):
        engine.submit(SimRequest(i, 100, 10), 0.0)
    engine.begin_step(0.0)
    assert (engine.num_running, engine.num_waiting) == (4, 2)
